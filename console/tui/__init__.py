"""`cetlab-console`, the Textual app: the app, its screens and styles, and `--serve` for a browser."""
