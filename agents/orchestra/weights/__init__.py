"""Model files read without loading them: GGUF and safetensors headers, and the VRAM a model needs from them."""
