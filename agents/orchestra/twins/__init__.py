"""What the engines' simulated twins share: the child process, scripted scenarios, the twin's state, structured output and pooling."""
