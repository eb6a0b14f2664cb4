"""Console screens, one per file."""
