"""The machinery every side uses: the RPC registry, the client core (link), the typed view, peers, the store, keys, limits."""
