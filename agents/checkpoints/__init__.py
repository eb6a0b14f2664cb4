"""Checkpoints of the runs on this machine: parsing, discovery, actions, serving, and their methods."""
