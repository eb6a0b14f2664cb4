"""Any OpenAI-compatible server lab.yaml starts by its own command line: the engine, and the template a new engine copies."""
