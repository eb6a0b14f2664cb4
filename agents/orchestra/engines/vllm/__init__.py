"""vLLM: the engine (engine.py), its simulated twin with sleep mode (twin.py) and its LoRA rules (lora_rules.py)."""
