"""The lab as the console sees it, Textual-free: the FleetClient, LabState, typed replies and the views' data."""
