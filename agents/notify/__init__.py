"""Notifications: alerts and job events routed to Alertmanager, webhooks and commands, from a durable queue."""
