"""One machine in detail: host figures, each GPU with its history, and the GPU processes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from agents.runtime.view import MachineView
from agents.wire.sections.base import SectionFault
from console.tui.screens.base import LabScreen
from widgets.format import NA, fmt, fmt_ago, fmt_bytes
from widgets.gpu_panel import SERIES, GpuPanel
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown

PROCESS_COLUMNS = [("gpu", "GPU", 4), ("pid", "PID", 8), ("user", "user", 10), ("vram", "VRAM", 8), ("command", "command", None)]


class MachineScreen(LabScreen):
    VIEW_NAME = "machine"
    CLOCK_S = 1.0  # "last seen ... ago" while it is offline
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]
    DEFAULT_CSS = """
    MachineScreen #host { padding: 0 1; height: auto; }
    MachineScreen #procs { height: auto; max-height: 20; }
    /* the GPU panels share the rows the view has (2-row charts on a 50-row screen before); too many scroll */
    MachineScreen #gpus { height: 1fr; }
    MachineScreen GpuPanel { height: 1fr; min-height: 7; }
    MachineScreen GpuPanel > Horizontal, MachineScreen GpuPanel > Horizontal > Vertical { height: 1fr; }
    MachineScreen GpuPanel ScaleChart { height: 1fr; min-height: 2; }
    """

    def __init__(self, machine: str):
        super().__init__()
        self.machine = machine
        self._gpu_indices: list[int] = []

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="host")
        yield VerticalScroll(id="gpus")
        yield Static(" GPU processes", classes="title")
        yield LiveTable(PROCESS_COLUMNS, lambda cells: cells, id="procs")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()

    @property
    def view(self) -> MachineView:
        return self.lab_app.state.machines[self.machine]

    def shown_faults(self) -> list[tuple[str, SectionFault]]:
        """Every failing section of this machine: its detail is where one looks first."""
        return [(m, f) for m, f in self.lab_app.state.faults() if m == self.machine]

    def refresh_data(self) -> None:
        view = self.view
        host = view.host
        sim = "  [black on yellow] SIM [/]" if view.simulated else ""
        if view.online:
            text = (
                f"[b]{esc(self.machine)}[/b]  {esc(view.config.role)}{sim}  [green]● online[/]  "
                f"CPU {fmt(host.cpu_pct, '.0f', '%')} of {fmt(host.cpu_count)} cores  "
                f"load {fmt(host.load_1, '.2f')}/{fmt(host.load_5, '.2f')}/{fmt(host.load_15, '.2f')}  "
                f"RAM {fmt_bytes(host.ram_used_bytes)}/{fmt_bytes(host.ram_total_bytes)}  "
                f"swap {fmt_bytes(host.swap_used_bytes)}/{fmt_bytes(host.swap_total_bytes)}  "
                f"disk {fmt_bytes(host.disk_used_bytes)}/{fmt_bytes(host.disk_total_bytes)}  "
                f"net ↓{fmt_bytes(host.net_rx_bytes_per_s)}/s ↑{fmt_bytes(host.net_tx_bytes_per_s)}/s"
            )
        else:
            text = f"[b]{esc(self.machine)}[/b]  [bold red]{esc(view.link.upper())}[/]  last seen {fmt_ago(view.last_seen, self.lab_app.clock())}\n{esc(view.error or '')}"
        self.query_one("#host", Static).update(shown(text))
        self._refresh_gpus(view)
        self._refresh_processes(view)

    def _refresh_gpus(self, view: MachineView) -> None:
        container = self.query_one("#gpus", VerticalScroll)
        indices = sorted(view.gpus)
        if indices != self._gpu_indices:
            self._gpu_indices = indices
            container.remove_children()
            container.mount_all(GpuPanel(id=f"gpu-{i}") for i in indices)
        panels = list(container.query(GpuPanel))
        if len(panels) != len(indices) or not all(panel.is_mounted for panel in panels):
            self.drawn_version = -1  # the panels fill on a later tick of the scheduler, once mounted
            return
        owners = view.gpu_owners()
        limits = self.thresholds()
        for panel in panels:
            i = int(str(panel.id).removeprefix("gpu-"))
            if i in view.gpus:
                history = {key: view.spark(f"gpu{i}.{key}") for key, _ in SERIES}
                panel.show(
                    view.gpus[i], history, owners.get(i), limits, view.gpu_support.for_gpu(i) if view.gpu_support else None
                )

    def _refresh_processes(self, view: MachineView) -> None:
        wanted: dict[str, tuple[str, ...]] = {}
        for i, gpu in view.gpus.items():
            for proc in gpu.processes:
                key = f"{i}:{proc.pid}:{proc.command}"
                wanted[key] = (str(i), str(proc.pid), proc.user or NA, fmt_bytes(proc.mem_used_bytes), (proc.command or NA)[:120])
        self.query_one("#procs", LiveTable).show(wanted)
