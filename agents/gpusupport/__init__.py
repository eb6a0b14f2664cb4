"""What each GPU can run: compute capabilities, the stacks the agent launches (torch, vLLM, llama-server) and the matrix of the two."""
