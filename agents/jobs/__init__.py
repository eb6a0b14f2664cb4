"""Trainer jobs: recipes, process supervision, multi-node runs, re-adoption after an agent restart (component.JobsComponent)."""
