"""The lab gateway: one OpenAI-compatible endpoint for every model of the lab, local or cloud."""
