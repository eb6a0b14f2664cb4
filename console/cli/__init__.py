"""`cetlab`, the scriptable CLI: `main` (the parser, the context, `status`), one module per verb family."""
