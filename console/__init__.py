"""cetlab console: the Textual app, the CLI and the FleetClient they share."""
