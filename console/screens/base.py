"""LabScreen: what every console view shares (data refresh at the app's fixed rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen

from widgets.format import Thresholds

if TYPE_CHECKING:
    from console.app import CetlabApp


class LabScreen(Screen):
    """A view of the lab. The app calls refresh_data() at a fixed rate while it is shown."""

    # Key hints of this view's verbs (shown in the footer through BINDINGS), and its name for `:`.
    VIEW_NAME = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shown_rows: dict[str, tuple] = {}  # what this view's live table shows (widgets.live_table)
        self.ready = False  # True once mounted: refresh_data may run

    @property
    def lab_app(self) -> CetlabApp:
        return self.app  # type: ignore[return-value]

    def refresh_header(self) -> None:
        from widgets.lab_header import LabHeader, header_text

        for header in self.query(LabHeader):
            app = self.lab_app
            state = app.state
            gpus, vram = state.gpu_totals()
            online = sum(v.online for v in state.machines.values())
            simulated = any(v.simulated for v in state.machines.values())
            header.show(header_text(state.lab.lab, self.VIEW_NAME, online, len(state.machines), gpus, vram,
                                    simulated, app.readonly, app.clock(), app.header_cost()))

    def refresh_data(self) -> None:
        """Read app.state and update widgets that changed; never fetch here."""

    def on_mount(self) -> None:
        # Textual runs this after the subclass's on_mount (handlers run up the MRO): the view is set up.
        self.ready = True

    def on_screen_resume(self) -> None:
        if self.ready:
            self.refresh_data()

    def thresholds(self) -> Thresholds:
        alerts = self.lab_app.lab.alerts
        return Thresholds(temp_warn_c=alerts.temp_c - 10, temp_alert_c=alerts.temp_c,
                          vram_warn_pct=min(alerts.vram_pct, 85.0), vram_alert_pct=alerts.vram_pct)

    def require_operator(self) -> bool:
        """False (with a notification) when this console may not act."""
        if self.lab_app.readonly:
            self.notify("read-only console: actions are disabled", severity="warning")
            return False
        return True
