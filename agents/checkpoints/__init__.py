"""Checkpoints of the runs on this machine: parsing, discovery, actions, serving, and their methods."""

from agents.checkpoints.component import CheckpointsComponent
from agents.checkpoints.parsing import Checkpoint, history_points, mark_best
from agents.checkpoints.serving import merge_adapter

__all__ = ["Checkpoint", "CheckpointsComponent", "history_points", "mark_best", "merge_adapter"]
