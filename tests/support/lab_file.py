"""What tests/e2e/wire/test_lab_file.py, tests/fast/wire/test_lab_file.py share: GOOD_MACHINE."""

from __future__ import annotations

GOOD_MACHINE = """
lab: t
machines:
  - name: box
    gpus:
      sim:
        - {name: "Tesla P4", memory_gib: 8, tdp_w: 75}
"""
