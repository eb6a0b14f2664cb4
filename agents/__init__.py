"""cetlab: the agent daemon and everything both sides share about the wire."""

__version__ = "0.1.0"
