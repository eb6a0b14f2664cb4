"""Reusable Textual widgets that take plain data and render it."""
