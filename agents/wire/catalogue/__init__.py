"""The method catalogue, one module per component: each RPC method's params model, result model, role and doc."""
