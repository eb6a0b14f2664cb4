"""Samplers: GPUs through NVML or the simulator, the host through psutil."""
