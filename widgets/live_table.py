"""Live DataTables without flicker: stable row keys, only changed cells updated, never clear()."""

from __future__ import annotations

from textual.widgets import DataTable


def sync_rows(table: DataTable, rows: dict[str, tuple], columns: list[str], shown: dict[str, tuple]) -> bool:
    """Make `table` show `rows` (key -> cells); `shown` remembers what it shows. True if rows were added."""
    for key in [k for k in shown if k not in rows]:
        table.remove_row(key)
        del shown[key]
    added = False
    for key, cells in rows.items():
        old = shown.get(key)
        if old is None:
            table.add_row(*cells, key=key)
            added = True
        elif old != cells:
            for column, value, before in zip(columns, cells, old):
                if value != before:
                    table.update_cell(key, column, value)
        shown[key] = cells
    return added
