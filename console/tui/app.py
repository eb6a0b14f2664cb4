"""`cetlab-console`: the Textual app. Thin: screens live in console/tui/screens/, data in LabState."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual.app import App
from textual.binding import Binding
from textual.notifications import Notification, SeverityLevel
from textual.screen import Screen

from agents.wire.entry import quiet_pipe
from agents.wire.events import Notice, NoticeLevel, PushEvent
from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.protocol import EVENT_NOTICE, EVENT_TICK
from console.lab.client import FleetClient
from console.lab.state import LabState
from console.tui.screens.base import LabScreen
from console.tui.views import VIEWS
from widgets.wire import unhide, visible

RENDER_INTERVAL_S = 0.5  # the one scheduler's period: fetches and redraws happen on its ticks, never per message


def _view_factory(name: str) -> Callable[[], Screen[None]]:
    module, cls, _ = VIEWS[name]

    def build() -> Screen[None]:
        screen: Screen[None] = getattr(importlib.import_module(module), cls)()
        return screen

    return build


# a notice's level -> its toast's severity (information for any other)
NOTICE_SEVERITY: dict[NoticeLevel, SeverityLevel] = {"critical": "error", "error": "error", "warning": "warning"}


def notice_toast(machine: str, notice: Notice) -> str:
    """A notice as its toast says it: the machine it came from (the agent leaves it out of the message), then the message."""
    return f"{machine}: {notice.message}"


class CetlabApp(App[None]):
    TITLE = "cetlab"
    CSS_PATH = "styles/app.tcss"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("colon", "jump", "Jump"),
        Binding("escape", "back", "Back", show=False),
    ]

    def __init__(
        self,
        lab: Lab,
        *,
        readonly: bool = False,
        trust_on_first_use: bool | None = None,
        client: FleetClient | None = None,
        connect: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.lab = lab
        self.readonly = readonly
        self.connect = connect  # False: show a prepared LabState only (snapshot tests)
        self.clock = clock
        self.state = client.state if client else LabState(lab)
        self.client = client or FleetClient(
            lab, self.state, trust_on_first_use=trust_on_first_use, subscribe=[EVENT_TICK, EVENT_NOTICE], on_event=self._on_event
        )
        self.render_ages: deque[float] = deque(maxlen=3600)  # newest data age at each render, for benchmarks
        self.notices: deque[Notification] = deque(maxlen=200)  # every notification shown (toasts), newest last
        for name in VIEWS:
            self.add_mode(name, _view_factory(name))

    async def on_mount(self) -> None:
        if self.connect:
            await self.client.start()
        await self.switch_mode("fleet")
        self.set_interval(RENDER_INTERVAL_S, self.render_tick)

    async def on_unmount(self) -> None:
        await self.client.stop()

    def render_tick(self) -> None:
        """The one scheduler: the visible view fetches what is due and redraws only when its data or its clock moved.

        Hidden views get no ticks at all, so their fetches pause with them.
        """
        if not self.is_running:  # shutting down: the views' widgets are being removed
            return
        screen = self.screen
        if not isinstance(screen, LabScreen):  # a modal: the view beneath it still shows, its clock and cost must go on
            beneath = next((s for s in reversed(self.screen_stack) if isinstance(s, LabScreen)), None)
            if beneath is not None and beneath.ready:
                beneath.refresh_header()
            return
        if not screen.ready:
            return
        screen.refresh_header()
        screen.tick(self.state.version, time.monotonic())
        now = self.clock()
        ages = [age for v in self.state.machines.values() if v.online and v.sample_t and (age := v.age_s(now)) is not None]
        if ages:
            self.render_ages.append(max(ages))

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Show a toast (Textual's notify) and keep it in `notices`, newest last: what the console told the operator.

        Always as text, never markup (`markup` is ignored): a toast says what an agent answered, and an agent's text
        (`[/x]`, `[@click=...]`, terminal escapes) must not be parsed or reach the terminal.
        """
        message, title = visible(unhide(message)), visible(unhide(title))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)
        self.notices.append(Notification(message, title, severity, timeout or self.NOTIFICATION_TIMEOUT, markup=False))

    def header_cost(self) -> Text | str | None:
        """The cost counter shown in every header: the lab's rate and today's total, from the agents' costs sections."""
        from console.lab.costs import live_totals
        from widgets.cost_counter import cost_text

        totals = live_totals(self.state)
        return None if totals is None else cost_text(totals)

    def _on_event(self, machine: str, _event: str, data: PushEvent) -> None:
        if isinstance(data, Notice):
            self.notify(notice_toast(machine, data), severity=NOTICE_SEVERITY.get(data.level, "information"), timeout=8)

    # -- actions

    def action_help(self) -> None:
        from console.lab.demo import demo_cli_hint
        from console.tui.screens.modals import HelpScreen

        screen = self.screen
        self.push_screen(
            HelpScreen(screen.visible_bindings() if isinstance(screen, LabScreen) else [], demo_cli_hint(self.lab.source))
        )

    def action_jump(self) -> None:
        from console.tui.screens.modals import JumpScreen

        def go(name: str | None) -> None:
            if name:
                self.call_later(self.switch_mode, name)

        self.push_screen(JumpScreen(), go)

    async def action_back(self) -> None:
        if len(self.screen_stack) > 1:
            self.pop_screen()
        elif self.current_mode != "fleet":
            await self.switch_mode("fleet")


@quiet_pipe
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cetlab-console", description="The cetlab console: your GPU lab, live.")
    parser.add_argument("--lab", help="lab.yaml (default: $CETLAB_LAB, else ./lab.yaml)")
    parser.add_argument("--demo", action="store_true", help="start the demo lab's agents on loopback and open it")
    parser.add_argument("--readonly", action="store_true", help="look, don't touch: every action is disabled")
    parser.add_argument("--trust-new-hosts", action="store_true", help="record unknown host keys on first use")
    from console.tui.serve import ServeError, serve_options

    serve_options(parser)
    args = parser.parse_args(argv)
    from console.lab.status import find_lab

    demo, demo_started = None, False
    try:
        if args.demo:
            from agents.runtime.demo import shown_path
            from console.lab.demo import DemoProcess, default_demo_dir, describe_gateway

            demo = DemoProcess(default_demo_dir(), source=Path(args.lab) if args.lab else None)
            print(
                f"starting the demo lab's agents (lab file, state, runs and checkpoints in {shown_path(demo.dir)}) ...",
                flush=True,
            )
            demo.start()
            demo_started = True
            # said before the screen takes the terminal (it stays in the scrollback) and again on quit
            print(describe_gateway(demo.dir, demo.lab_path, demo.source), end="", flush=True)
            lab_path = demo.lab_path
        else:
            lab_path = find_lab(args.lab)
        lab = load_lab(lab_path)
        if args.serve:
            from console.tui.serve import serve

            serve(
                lab_path,
                lab.lab,
                host=args.host,
                port=args.port,
                operator=args.operator and not args.readonly,
                open_to_network=args.open_to_network,
                max_sessions=args.max_sessions,
                trust_new_hosts=args.trust_new_hosts,
            )
        else:
            CetlabApp(lab, readonly=args.readonly, trust_on_first_use=args.trust_new_hosts or None).run()
    except LabError as exc:
        print(f"cetlab-console: invalid lab file\n{exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"cetlab-console: {exc}", file=sys.stderr)
        return 1
    except ServeError as exc:
        print(f"cetlab-console: {exc}", file=sys.stderr)
        return 2
    finally:
        if demo is not None:
            demo.stop()
        if demo is not None and demo_started:
            from console.lab.demo import demo_quit_message, describe_gateway

            print(demo_quit_message(demo.dir, describe_gateway(demo.dir, demo.lab_path, demo.source, try_line=False)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
