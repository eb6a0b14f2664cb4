"""lab.yaml's schema: the lab, its gateway and notification parts, and the YAML reader that names lines."""
