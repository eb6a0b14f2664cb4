"""LiveTable: a DataTable that owns its columns, its row cache and its selection; rows keyed, cells updated in place;
columns that do not fit a narrow table drop by priority."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text
from textual.events import Resize
from textual.widget import Widget
from textual.widgets import DataTable, Static

from widgets.wire import safe_cell

Column = tuple[str, str, int | None]  # (key, label, width or None for the rest)
Cell = str | Text  # a string is shown as text, never as markup (safe_cell)
Cells = tuple[Cell, ...]  # one row
CELL_PADDING = 2  # DataTable pads each cell by one on either side
REST_MIN = 4  # what a column "for the rest" (width None) counts for: a wide terminal keeps every column it showed


class LiveTable(DataTable[Cell]):
    """Give it items by row key (in the order to show); it adds, removes and updates only what changed.

    Subclasses set COLUMNS, DROP and cells(); a plain LiveTable takes them as arguments. DROP names the columns that go,
    first to last, while the table is narrower than its columns' sum (a split pane); the others always stay.
    """

    # columns drop (or the one "for the rest" shrinks) to fit: never a sideways scrollbar, whose thumb showed as a stray
    # mark on an empty row once the vertical scrollbar took its two cells
    DEFAULT_CSS = """
    LiveTable { overflow-x: hidden; }
    """
    COLUMNS: Sequence[Column] = ()
    DROP: tuple[str, ...] = ()
    REST_MIN_WIDTH = REST_MIN

    def __init__(
        self,
        columns: Sequence[Column] | None = None,
        cells: Callable[[Any], Cells] | None = None,
        drop: tuple[str, ...] | None = None,
        rest_min: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``rest_min``: the width the column "for the rest" needs (default REST_MIN_WIDTH); columns in the drop order go
        until it has that much."""
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rest_min = rest_min if rest_min is not None else self.REST_MIN_WIDTH
        self.column_spec = columns if columns is not None else self.COLUMNS
        self.drop_order = drop if drop is not None else self.DROP
        self._cells_of = cells
        self.items: dict[str, Any] = {}  # the items shown (those the filter lets through)
        self.all_items: dict[str, Any] = {}  # every item given to show()
        self.filter_text = ""  # `/`: only rows whose text holds this (any case) are shown
        self._shown: dict[str, Cells] = {}  # what each row shows now (every column's cell, shown or not)
        self.shown_columns: list[int] = list(range(len(self.column_spec)))  # indices into column_spec, in order
        self.rest_width: int | None = None  # the width left for the column "for the rest" (None: its content's)
        self.no_match: Static | None = None  # under the table while `/` hides every row: says so (an empty table said nothing)

    def cells(self, item: Any) -> Cells:
        """The row of one item (plain data in, strings or Rich text out; a string is shown as text, never as markup)."""
        if self._cells_of is None:
            raise NotImplementedError("give LiveTable cells= or override cells()")
        return self._cells_of(item)

    def _ensure_columns(self) -> None:
        if not self.columns:  # show() can come before the mount
            for index in self.shown_columns:
                key, label, width = self.column_spec[index]
                self.add_column(label, key=key, width=width if width is not None else self.rest_width)

    def columns_for(self, width: int) -> list[int]:
        """The columns that fit `width` cells: those in the drop order go, first to last, until the rest fit."""
        shown = list(range(len(self.column_spec)))
        index_of = {key: i for i, (key, _, _) in enumerate(self.column_spec)}

        def needed() -> int:
            return sum((self.column_spec[i][2] or self.rest_min) + CELL_PADDING for i in shown)

        for key in self.drop_order:
            if needed() <= width:
                break
            shown.remove(index_of[key])
        return shown

    def on_resize(self, event: Resize) -> None:
        """Drop (or bring back) the columns that do not fit the new width."""
        width = self.scrollable_content_region.width or event.size.width
        wanted = self.columns_for(width)
        fixed = sum((self.column_spec[i][2] or 0) + CELL_PADDING for i in wanted)
        rest = max(REST_MIN, width - fixed - 1) if any(self.column_spec[i][2] is None for i in wanted) else None
        if wanted != self.shown_columns or rest != self.rest_width:
            selected = self.selected_key()
            self.shown_columns, self.rest_width = wanted, rest
            self.clear(columns=True)
            self._ensure_columns()
            self._rebuild(self._shown)
            if selected is not None:
                self.select_key(selected)

    def _visible(self, cells: Cells) -> Cells:
        return tuple(cells[i] for i in self.shown_columns)

    def set_filter(self, text: str) -> None:
        """Show only the rows whose text holds `text` (any case); "" shows every row again."""
        self.filter_text = text.strip()
        parent = self.parent
        if self.filter_text and self.no_match is None and isinstance(parent, Widget):
            self.no_match = Static("", classes="no-match")
            self.no_match.display = False
            parent.mount(self.no_match, after=self)
        self.show(self.all_items)

    def _say_no_match(self) -> None:
        if self.no_match is None:
            return
        hidden = bool(self.filter_text) and bool(self.all_items) and not self.items
        self.no_match.display = hidden
        if hidden:
            self.no_match.update(
                Text(f"no row of {len(self.all_items)} matches {self.filter_text!r}; / and enter on nothing shows all", "yellow")
            )

    def show(self, items: dict[str, Any]) -> None:
        """Show these items, in this order (those the filter lets through); the cursor stays on its row's key."""
        self._ensure_columns()
        self.all_items = items
        # every cell goes through safe_cell: a string off the wire (`[/x]`, `[@click=...]`) is text, never DataTable markup
        wanted = {key: tuple(map(safe_cell, self.cells(item))) for key, item in items.items()}
        if self.filter_text:
            needle = self.filter_text.casefold()
            wanted = {key: cells for key, cells in wanted.items() if needle in " ".join(map(str, cells)).casefold()}
        self.items = {key: items[key] for key in wanted}
        self._say_no_match()
        for key in [k for k in self._shown if k not in wanted]:
            self.remove_row(key)
            del self._shown[key]
        kept = list(self._shown)
        if list(wanted)[: len(kept)] != kept:  # rows moved: rebuild in order (rare: a new job on top, a resort)
            self._rebuild(wanted)
            return
        keys = [self.column_spec[i][0] for i in self.shown_columns]
        for key, cells in wanted.items():
            old = self._shown.get(key)
            if old is None:
                self.add_row(*self._visible(cells), key=key)
            elif old != cells:
                for column, value, before in zip(keys, self._visible(cells), self._visible(old)):
                    if value != before:
                        self.update_cell(key, column, value)
            self._shown[key] = cells

    def _rebuild(self, wanted: dict[str, Cells]) -> None:
        selected = self.selected_key()
        self.clear()
        for key, cells in wanted.items():
            self.add_row(*self._visible(cells), key=key)
        self._shown = dict(wanted)
        if selected in wanted:
            self.move_cursor(row=list(wanted).index(selected))

    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def selected(self) -> Any | None:
        """The item under the cursor, or None."""
        key = self.selected_key()
        return None if key is None else self.items.get(key)

    def select_key(self, key: str) -> None:
        """Move the cursor to this row."""
        if key in self._shown:
            self.move_cursor(row=list(self._shown).index(key))
