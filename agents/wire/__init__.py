"""What crosses a boundary, as types: the protocol, the method catalogue, pushed events, tick sections, lab.yaml's schema, states, safe reads. Imports nothing else of cetlab."""
