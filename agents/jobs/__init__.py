"""Trainer jobs: recipes, process supervision, re-adoption after an agent restart (see supervisor.JobsComponent)."""
