"""What tests/e2e/tui/test_lab_view.py, tests/fast/runtime/test_inprocess.py, tests/fast/tui/test_lab_view.py share:
SIZE, card_text, header_of."""

from __future__ import annotations

from widgets.lab_header import LabHeader
from widgets.machine_card import MachineCard

SIZE = (160, 50)


def card_text(app, name: str) -> str:
    card = app.screen.query_one(f"#card-{name}", MachineCard)
    return str(card.header)


def header_of(app) -> str:
    return str(app.screen.query_one(LabHeader).text)
