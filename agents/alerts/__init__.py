"""Alerts: thresholds on each tick, their history and acknowledgement."""
