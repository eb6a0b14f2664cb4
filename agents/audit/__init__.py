"""The audit log of operator actions and refused calls."""
