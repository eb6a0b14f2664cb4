"""cetlab-train: the default LoRA / QLoRA fine-tuning trainer that cetlab's agents launch."""
