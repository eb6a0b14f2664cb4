"""The Orchestra view (`:models`): the model pool live; warm, sleep, cold, swap and pin by key."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from agents.wire.catalogue.method import NoParams
from agents.wire.catalogue.models import (
    MODELS_COLD,
    MODELS_PIN,
    MODELS_ROTATE,
    MODELS_SLEEP,
    MODELS_SWAP,
    MODELS_WARM,
    ModelParams,
    PinParams,
    SwapParams,
)
from agents.wire.lab.model import Lab
from agents.wire.lab.replicas import machines_of
from agents.wire.protocol import GpuSample
from agents.wire.sections.models import ModelInfo, Rotation
from agents.wire.states import MODEL_ENGINE_UP, MODEL_HOLDS_GPU, ModelState
from agents.wire.vram_fit import where_fits
from console.lab.replicas import grouped, replica_machines
from console.lab.rotation import overhead_words
from console.tui.screens.base import LabScreen
from console.tui.screens.modals import PickModelScreen
from widgets.format import fmt_duration, fmt_gib, machines_text
from widgets.lab_header import LabHeader
from widgets.orchestra_table import OrchestraTable
from widgets.wire import esc, shown


def rotation_text(rotations: dict[str, Rotation | None], now: float, models_on: dict[str, set[str]] | None = None) -> str:
    """One line per machine with a plan: its step, the next rotation with its countdown and the machine's own models
    in the next set (``models_on``: machine -> its models; None: the whole set), its own measured overhead."""
    planned = {m: r for m, r in rotations.items() if r and r.plan}
    if not planned:
        return "no rotation plan (lab.yaml orchestra.rotation)"
    lines = []
    for machine, rotation in planned.items():
        step = (
            f"not rotated yet ({len(rotation.plan)} sets)"
            if rotation.index is None
            else f"step {rotation.index + 1} of {len(rotation.plan)}"
        )
        parts = [f"[b]{esc(machine)}[/b] rotation: {step}"]
        if rotation.next_at is not None:
            coming = [m for m in rotation.next_set or [] if models_on is None or m in models_on.get(machine, set())]
            parts.append(
                f"next in {fmt_duration(max(0.0, rotation.next_at - now))} (at {time.strftime('%H:%M', time.localtime(rotation.next_at))})"
                + (f" → {esc(', '.join(coming))}" if coming else f": the next set has none of {esc(machine)}'s models")
            )
        if rotation.running:
            parts.append("[b yellow]rotating now[/]")
        if rotation.overhead_pct is not None:
            judged = rotation.overhead_judged
            colour = "dim" if not judged else "green" if rotation.overhead_pct < (rotation.target_pct or 0.0) else "red"
            parts.append(f"[{colour}]{esc(overhead_words(rotation))}[/]")
        lines.append(" · ".join(parts))
    return "\n".join(lines)


def models_by_machine(lab: Lab) -> dict[str, set[str]]:
    """Each machine's models in lab.yaml: a rotation line names only these."""
    found: dict[str, set[str]] = {}
    for model in lab.models:
        for machine in machines_of(model):  # a model with replicas: on each of their machines
            found.setdefault(machine, set()).add(model.name)
    return found


def swap_fit(out: ModelInfo, incoming: ModelInfo, gpus: dict[int, GpuSample]) -> tuple[list[int], str | None]:
    """Where a swap would bring `incoming` up (the agent's rule) and why it would not fit there (None: it fits).

    A sleeping model wakes on the GPUs it sleeps on; another takes out's GPUs when it needs as many.
    Free memory is the last sample's, plus what `out` gives back on its GPUs.
    """
    if incoming.state == ModelState.SLEEPING or len(out.gpus) != len(incoming.gpus):
        target = list(incoming.gpus)
    else:
        target = list(out.gpus)
    if not target or not incoming.vram_bytes:
        return target, None
    need = incoming.vram_bytes / len(target)
    given_back = out.vram_bytes / len(out.gpus) if out.gpus and out.state == ModelState.WARM else 0
    for index in target:
        gpu = gpus.get(index)
        if gpu is None or gpu.mem_total_bytes is None or gpu.mem_used_bytes is None:
            continue  # not reported: the agent decides
        free = gpu.mem_total_bytes - gpu.mem_used_bytes + (given_back if index in out.gpus else 0)
        if free < need:
            return target, f"needs {fmt_gib(need)} on GPU {index}, {fmt_gib(max(0.0, free))} free"
    return target, None


def detail_text(model: ModelInfo | None, replicas: list[str] | None = None) -> str:
    """The selected model's line; ``replicas``: the machines of its placements, for a model with replicas."""
    if model is None:
        return ""
    parts = [
        f"[b]{esc(model.name)}[/b] on {esc(machines_text(model.machine, model.machines))}"
    ]  # the agent's strings: esc(), never markup
    if replicas:
        others = [m for m in replicas if m != model.machine]
        parts.append(f"replica {replicas.index(model.machine) + 1 if model.machine in replicas else '?'} of {len(replicas)}")
        parts.append(esc(f"also on {', '.join(others)}"))
    if model.draining:
        parts.append("[b yellow]draining[/]: ends its requests, gets no new one")
    if model.endpoint and model.state == ModelState.WARM:
        parts.append(esc(f"endpoint {model.endpoint} (model {model.served_name})"))
    if model.tokens_per_s is not None:
        window = f" over the last {model.tokens_per_s_window_s:g} s" if model.tokens_per_s_window_s else ""
        parts.append(f"{model.tokens_per_s:.1f} tokens/s{window}")
    if model.ttft_s is not None:
        parts.append(f"TTFT {model.ttft_s:.2f}s")
    if model.swap_s is not None:
        parts.append(f"last swap {model.swap_s:.1f}s")
    if model.simulated:
        parts.append("[b magenta]SIM[/] engine: figures are simulated")
    if model.vram_need_bytes is not None and model.vram_source != "lab.yaml":  # typed: the VRAM column says it all
        parts.append(esc(f"VRAM need {fmt_gib(model.vram_need_bytes)} {model.vram_source}"))
    elif model.vram_need_bytes is None and model.vram_detail:  # an agent that knows why it does not know
        parts.append(esc("VRAM need unknown: placement does not check it"))
    line = " · ".join(parts)
    if model.error:
        line += f"\n[b red]failed:[/] {esc(model.error.message)}"
        if model.error.log_tail:
            line += f"\n[dim]{esc(model.error.log_tail[-1])}[/]"
    return line


class ModelsScreen(LabScreen):
    VIEW_NAME = "models"
    SECTIONS = ("models", "link")  # redrawn only when these change
    CLOCK_S = 1.0  # the rotation's countdown
    ACTING = frozenset({"warm", "sleep", "cold", "swap", "pin", "rotate"})
    BINDINGS = [
        Binding("w", "warm", "Warm"),
        Binding("s", "sleep", "Sleep"),
        Binding("c", "cold", "Cold"),
        Binding("x", "swap", "Swap"),
        Binding("p", "pin", "Pin"),
        Binding("R", "rotate", "Rotate now"),
    ]
    DEFAULT_CSS = """
    ModelsScreen #models-rotation { height: auto; padding: 0 1; }
    ModelsScreen #models-detail { height: auto; min-height: 2; padding: 0 1; border-top: solid $panel; }
    """

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="models-rotation")
        yield OrchestraTable(id="models-table")
        yield Static("", id="models-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()

    # -- data

    def pool(self) -> tuple[list[ModelInfo], dict[str, Rotation | None]]:
        models, rotations = [], {}
        for view in self.lab_app.state.machines.values():
            if view.models is not None:
                models += view.models.models
                rotations[view.name] = view.models.rotation
        return grouped(models), rotations  # a model's replicas side by side

    def detail(self, model: ModelInfo | None) -> str:
        return detail_text(model, replica_machines(self.lab_app.lab, model) if model is not None else None)

    def refresh_data(self) -> None:
        models, rotations = self.pool()
        table = self.query_one(OrchestraTable)
        with self.app.batch_update():
            table.show_models(models)
            self.query_one("#models-rotation", Static).update(
                shown(rotation_text(rotations, self.lab_app.clock(), models_by_machine(self.lab_app.lab)))
            )
            self.query_one("#models-detail", Static).update(shown(self.detail(table.selected())))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.query_one("#models-detail", Static).update(shown(self.detail(self.query_one(OrchestraTable).selected())))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:  # enter on a row: swap it out
        if not self.lab_app.readonly:
            self.action_swap()

    def selected(self) -> ModelInfo | None:
        model = self.query_one(OrchestraTable).selected()
        if model is None:
            self.notify("no model selected", severity="warning")
            return None
        models, _ = self.pool()  # the newest tick, not the last redraw: keys act on what the model is now
        return next((m for m in models if (m.machine, m.name) == (model.machine, model.name)), model)

    # -- actions

    def action_warm(self) -> None:
        if model := self.selected():
            if model.state == ModelState.WARM and not model.op:  # nothing to do: no call, no audit row
                self.notify(f"{model.name} is already warm")
                return
            self.act(model.machine, MODELS_WARM, ModelParams(model=model.name), f"warming {model.name}")

    def action_sleep(self) -> None:
        if model := self.selected():
            if model.pinned:  # said before the question, not after the y
                self.notify(f"{model.name} is pinned: unpin it (p) before putting it to sleep", severity="warning")
                return
            if not model.can_sleep:  # said before the question: after a y the agent would only refuse
                self.notify(
                    f"{model.name}'s engine ({model.engine}) has no sleep mode: stop it with c (cold)", severity="warning"
                )
                return
            self.confirm(
                f"Put [b]{esc(model.name)}[/b] to sleep? It stops answering until woken (about {model.wake_s or 1:.0f} s).",
                lambda: self.act(model.machine, MODELS_SLEEP, ModelParams(model=model.name), f"{model.name} going to sleep"),
            )

    def action_cold(self) -> None:
        model = self.selected()
        if model is None:
            return

        def go() -> None:
            self.act(model.machine, MODELS_COLD, ModelParams(model=model.name), f"stopping {model.name}", timeout=30.0)

        if model.state in MODEL_ENGINE_UP:  # stopping it interrupts (or drops) a model
            self.confirm(
                f"Stop [b]{esc(model.name)}[/b] ({esc(model.state)})? Its engine exits; bringing it back is a full load.", go
            )
        else:
            go()

    def action_pin(self) -> None:
        if model := self.selected():
            pinned = not model.pinned
            self.act(
                model.machine,
                MODELS_PIN,
                PinParams(model=model.name, pinned=pinned),
                f"{'pinned' if pinned else 'unpinned'} {model.name}",
            )

    def action_rotate(self) -> None:
        """R: the next step of the rotation plan now, on every machine that has one (after a question)."""
        _, rotations = self.pool()
        machines = [m for m, r in rotations.items() if r and r.plan]
        if not machines:
            self.notify("no rotation plan (lab.yaml orchestra.rotation)", severity="warning")
            return

        def go() -> None:
            for machine in machines:
                self.act(machine, MODELS_ROTATE, NoParams(), f"rotating {machine}: the next set of its plan comes up")

        self.confirm(
            f"Rotate now on {esc(', '.join(machines))}? Models going out stop answering while the next set comes up.", go
        )

    def action_swap(self) -> None:
        out = self.selected()
        if out is None:
            return
        models, _ = self.pool()
        if out.state not in (ModelState.WARM, ModelState.SLEEPING):
            self.notify(f"{out.name} is {out.state}: select a warm model to swap out, or press w", severity="warning")
            return
        candidates = [m for m in models if m.machine == out.machine and m.name != out.name and m.state not in MODEL_HOLDS_GPU]
        if not candidates:
            self.notify(f"no other model on {out.machine} to bring in", severity="warning")
            return

        fits = {m.name: swap_fit(out, m, self.lab_app.state.machines[out.machine].gpus) for m in candidates}
        candidates.sort(key=lambda m: fits[m.name][1] is not None)  # the swaps that can work first

        others = [m for m in replica_machines(self.lab_app.lab, out) if m != out.machine]
        going = (
            f"its replica on {esc(out.machine)} out (it drains first; "
            + (f"the one on {esc(others[0])} keeps" if len(others) == 1 else f"those on {esc(', '.join(others))} keep")
            + " answering)"
            if others
            else "out (it stops answering)"
        )

        def picked(name: str | None) -> None:
            if name:
                self.confirm(
                    f"Swap [b]{esc(out.name)}[/b] {going} and bring [b]{esc(name)}[/b] in on GPU "
                    f"{','.join(map(str, fits[name][0]))} of {esc(out.machine)}?",
                    lambda: self.act(
                        out.machine,
                        MODELS_SWAP,
                        SwapParams.model_validate({"out": out.name, "in": name}),
                        f"swapping {out.name} → {name}",
                    ),
                )

        lab_gpus = self.lab_app.state.gpu_memory()
        needs = {m.name: m.vram_need_bytes for m in candidates}
        notes = {
            name: (
                f"GPU {','.join(map(str, gpus))}" + ("" if needs[name] is not None else "  need unknown: not checked"),
                None if why is None else f"{why}; {where_fits(needs[name], lab_gpus) or 'its need is unknown'}",
            )
            for name, (gpus, why) in fits.items()
        }
        self.app.push_screen(PickModelScreen(f"bring in on {out.machine} instead of {out.name}:", candidates, notes), picked)
