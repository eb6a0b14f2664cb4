"""The lab gateway: one OpenAI-compatible endpoint for every model of the lab, local or cloud."""

# agents.wire.lab.model imports this package's config (its schema); loading agents.wire.lab.model first keeps that cycle in one order.
import agents.wire.lab.model  # noqa: F401
