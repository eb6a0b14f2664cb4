"""The energy and money ledger."""
