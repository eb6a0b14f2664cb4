"""python -m agents.train: the same as the cetlab-train command."""

from agents.train.cli import main

raise SystemExit(main())
