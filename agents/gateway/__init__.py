"""The lab gateway: one OpenAI-compatible endpoint for every model of the lab, local or cloud."""

# agents.lab imports this package's config (its schema); loading agents.lab first keeps that cycle in one order.
import agents.lab  # noqa: F401
