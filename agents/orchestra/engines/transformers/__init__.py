"""`transformers serve`: the engine (engine.py)."""
