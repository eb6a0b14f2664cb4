"""The agent's process: the Agent, the daemon's CLI, the SSH server, the unix-socket channel, metrics, doctor, systemd."""
