"""The lab queue: one scheduler for a team's training jobs (lab.yaml scheduler:, a recipe's need: and priority:)."""
