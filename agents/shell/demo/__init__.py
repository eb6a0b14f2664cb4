"""The demo lab on the agent's side: its builder (lab), its gateway's and notifications' parts, and its process (__main__)."""
