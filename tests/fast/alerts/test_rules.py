"""Alert rules: each fires after its duration and clears with hysteresis; end to end over SSH with sim.override."""

from __future__ import annotations

import itertools

import pytest

from agents.alerts.component import Alert, AlertEngine
from agents.wire.lab.model import Alerts
from agents.wire.protocol import GpuSample, HostSample, Telemetry
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo
from tests.support.alert_rules import GIB, LAB, gpu
from tests.support.waits import wait_for

SETTINGS = Alerts(
    temp_c=85,
    temp_for_s=3,
    vram_pct=95,
    vram_for_s=3,
    starved_util_pct=50,
    starved_for_s=3,
    no_improvement_steps=100,
    checkpoint_save_s=30,
    disk_free_pct=5,
    disk_for_s=2,
    hysteresis_pct=5,
    clear_for_s=2,
)


def telemetry(*gpus: GpuSample, disk_free_pct: float = 50.0) -> Telemetry:
    host = HostSample(disk_path="/data", disk_used_bytes=int((100 - disk_free_pct) * GIB), disk_total_bytes=100 * GIB)
    return Telemetry(machine="m", t=0.0, gpus=list(gpus), host=host)


JOB_FIELDS = {"recipe": "cet-d", "machine": "m", "started_at": 1.0, "output_dir": "/runs/x", "log_path": "/logs/x"}


MODEL_FIELDS = {"machine": "m", "engine": "vllm", "since": 1.0}


class Script:
    """Feeds an engine one tick per second and records when each rule fired and cleared."""

    def __init__(self, settings: Alerts = SETTINGS):
        self.engine = AlertEngine(settings)
        self.t = 0
        self.events: list[tuple[int, str, str, str]] = []
        self._n = itertools.count(1)

    def _new(self, obs, t) -> Alert:
        return Alert(
            n=next(self._n),
            machine="m",
            rule=obs.rule,
            target=obs.target,
            level=obs.level,
            message=obs.message,
            fired_at=t,
            value=obs.value,
            threshold=obs.threshold,
            gpu=obs.gpu,
            job=obs.job,
            model=obs.model,
        )

    def tick(self, tel: Telemetry, jobs=None, models=None, rule: str | None = None) -> None:
        # the sections as the agent types them: the fields a test leaves out take their usual values
        jobs = [JobInfo.model_validate({**JOB_FIELDS, **j}) for j in jobs or []]
        models = [ModelInfo.model_validate({**MODEL_FIELDS, **m}) for m in models or []]
        fired, cleared = self.engine.evaluate(self.t, self.engine.observe(tel, jobs, models), self._new)
        self.events += [(self.t, "fired", a.rule, a.target) for a in fired if rule in (None, a.rule)]
        self.events += [(self.t, "cleared", a.rule, a.target) for a in cleared if rule in (None, a.rule)]
        self.t += 1


def test_hot_gpu_fires_after_its_duration_and_clears_below_the_hysteresis_band():
    s = Script()
    for temp in (80, 86, 84, 86, 84):  # flapping around the line: never 3 s in a row
        s.tick(telemetry(gpu(temp_c=temp)))
    assert s.events == []
    for temp in (87, 88, 89, 90):  # t=5..8: over since 5, fires at 8
        s.tick(telemetry(gpu(temp_c=temp)))
    assert s.events == [(8, "fired", "gpu_hot", "gpu0")]
    for temp in (84, 82, 86, 80, 80, 79):  # t=9..14: 84 and 82 are inside the band (clear below 80.75)
        s.tick(telemetry(gpu(temp_c=temp)))
    assert s.events[1:] == [(14, "cleared", "gpu_hot", "gpu0")]  # below the band since 12, for clear_for_s=2
    assert [a.message for a in s.engine.active()] == []


def test_vram_full_and_the_gpu_disappearing_clears_it():
    s = Script()
    for _ in range(4):
        s.tick(telemetry(gpu(mem_gib=31.0)))  # 96.9 %
    assert s.events == [(3, "fired", "vram_full", "gpu0")]
    s.tick(telemetry(gpu(mem_gib=29.5)))  # 92 %: inside the band (clear below 90.25 %)
    s.tick(telemetry(gpu(mem_gib=29.5)))
    s.tick(telemetry(gpu(mem_gib=29.5)))
    assert len(s.events) == 1
    s.tick(telemetry())  # the GPU is gone (lost, or the machine lists no GPUs)
    assert s.events[1] == (7, "cleared", "vram_full", "gpu0")


def test_gpu_starved_only_while_a_job_runs_on_it():
    s = Script()
    job = {"id": "3", "recipe": "cet-d", "gpus": [0], "state": "running"}
    for _ in range(4):
        s.tick(telemetry(gpu(util_pct=8)))  # no job: a quiet GPU is fine
    assert s.events == []
    for _ in range(4):
        s.tick(telemetry(gpu(util_pct=8)), jobs=[job])
    assert s.events == [(7, "fired", "gpu_starved", "gpu0")]
    alert = s.engine.active()[0]
    assert alert.job == "3" and "job 3 cet-d" in alert.message and "dataloader" in alert.message
    for util in (51, 52, 60, 61, 62):  # t=8..12: clear above 52.5 %, held for 2 s
        s.tick(telemetry(gpu(util_pct=util)), jobs=[job])
    assert s.events[1:] == [(12, "cleared", "gpu_starved", "gpu0")]
    for _ in range(4):
        s.tick(telemetry(gpu(util_pct=8)), jobs=[job])
    s.tick(telemetry(gpu(util_pct=8)), jobs=[{**job, "state": "exited"}])  # the job ended: nothing is starved
    assert [e[1] for e in s.events] == ["fired", "cleared", "fired", "cleared"]


def test_no_loss_improvement_for_n_steps():
    s = Script()
    job = {"id": "7", "gpus": [], "state": "running"}
    for step, loss in ((0, 1.0), (50, 0.9), (120, 0.95), (149, 0.93)):
        s.tick(telemetry(), jobs=[{**job, "step": step, "loss": loss}])
    assert s.events == []
    s.tick(telemetry(), jobs=[{**job, "step": 150, "loss": 0.91}])  # 100 steps since the best (0.9 at 50)
    assert s.events == [(4, "fired", "no_improvement", "job 7")]
    assert "best 0.9 at step 50" in s.engine.active()[0].message
    for step in (160, 170, 180):
        s.tick(telemetry(), jobs=[{**job, "step": step, "loss": 0.8}])  # improved at 160
    assert s.events[1:] == [(7, "cleared", "no_improvement", "job 7")]


def test_slow_checkpoint_save():
    s = Script()
    job = {
        "id": "7",
        "gpus": [],
        "state": "running",
        "checkpoints": [{"step": 1000, "path": "/runs/7/checkpoint-1000", "save_s": 12.0, "at": 1.0}],
    }
    s.tick(telemetry(), jobs=[job])
    assert s.events == []
    job["checkpoints"] = job["checkpoints"] + [{"step": 2000, "path": "/runs/7/checkpoint-2000", "save_s": 74.0, "at": 2.0}]
    s.tick(telemetry(), jobs=[job])
    assert s.events == [(1, "fired", "checkpoint_slow", "job 7")]
    assert "took 74 s" in s.engine.active()[0].message
    job["checkpoints"] = job["checkpoints"] + [{"step": 3000, "path": "/runs/7/checkpoint-3000", "save_s": 9.0, "at": 3.0}]
    for _ in range(3):
        s.tick(telemetry(), jobs=[job])
    assert s.events[1:] == [(4, "cleared", "checkpoint_slow", "job 7")]


def test_disk_nearly_full():
    s = Script()
    for free in (4.0, 4.0, 4.0):
        s.tick(telemetry(disk_free_pct=free))
    assert s.events == [(2, "fired", "disk_full", "disk")]
    for free in (5.1, 5.2, 5.1):  # above 5 % but inside the band (clear above 5.25 %)
        s.tick(telemetry(disk_free_pct=free))
    for free in (6.0, 6.0, 6.0):
        s.tick(telemetry(disk_free_pct=free))
    assert s.events[1:] == [(8, "cleared", "disk_full", "disk")]


def test_engine_failed():
    s = Script()
    s.tick(telemetry(), models=[{"name": "llama", "state": "warm"}])
    s.tick(telemetry(), models=[{"name": "llama", "state": "failed", "error": {"message": "CUDA out of memory"}}])
    assert s.events == [(1, "fired", "engine_failed", "model llama")]
    assert s.engine.active()[0].message == "model llama: engine failed: CUDA out of memory"
    for _ in range(3):
        s.tick(telemetry(), models=[{"name": "llama", "state": "loading"}])
    assert s.events[1:] == [(4, "cleared", "engine_failed", "model llama")]


@pytest.mark.timeout(90)
async def test_alerts_view_notifies_lists_and_acknowledges(in_process):
    """The console's view of the agent's alerts (the agents in this process: the same alerts over SSH are
    test_hot_gpu_alert_end_to_end's)."""
    from console.tui.screens.alerts import AlertsScreen

    running = await in_process(LAB)
    app = running.app()
    async with app.run_test(size=(160, 50)) as pilot:
        box = app.state.machines["box"]
        await wait_for(lambda: box.online and box.sample_t is not None, timeout=30)
        await pilot.press("colon", *"alerts", "enter")
        await wait_for(lambda: isinstance(app.screen, AlertsScreen), timeout=10)
        screen = app.screen
        table = screen.query_one("#alerts-table")

        def hot_rows() -> list:
            return [table.get_row(k) for k in table.rows if table.get_row(k)[4] == "gpu_hot"]

        await app.client.call("box", "sim.override", {"gpu": 0, "temp_c": 97})
        await wait_for(hot_rows, timeout=20)
        assert "ACTIVE" in hot_rows()[0][0] and hot_rows()[0][2] == "box" and "97 C" in hot_rows()[0][6]
        await wait_for(lambda: any("gpu0 Tesla P4 at 97 C" in n.message for n in app.notices), timeout=10)

        table.move_cursor(row=[k.value for k in table.rows].index(next(a.id for a in box.alerts.active if a.rule == "gpu_hot")))
        await pilot.press("a")
        await wait_for(lambda: "acked" in hot_rows()[0][0], timeout=10)

        await app.client.call("box", "sim.override", {"gpu": 0, "clear": True})
        await wait_for(lambda: not hot_rows(), timeout=20)
        await pilot.press("h")  # the history keeps it, cleared
        await wait_for(lambda: hot_rows() and "cleared" in hot_rows()[0][0], timeout=15)


def test_console_files_alerts_by_target_and_raises_offline_ones():
    from agents.wire.lab.model import parse_lab
    from console.lab.alerts import alerts_by_target
    from console.lab.state import LabState

    lab = parse_lab("lab: t\nalerts: {offline_for_s: 30}\nmachines: [{name: a}, {name: b}, {name: c}]\n")
    state = LabState(lab)
    state.set_link("a", "online")
    state.machines["a"].apply_section(
        "alerts",
        {
            "active": [  # as the agent's alerts section carries them
                {
                    "id": "a-1",
                    "n": 1,
                    "rule": "gpu_starved",
                    "target": "gpu0",
                    "job": "3",
                    "machine": "a",
                    "level": "warning",
                    "message": "gpu0 starved",
                    "fired_at": 10.0,
                },
                {
                    "id": "a-2",
                    "n": 2,
                    "rule": "engine_failed",
                    "target": "model llama",
                    "model": "llama",
                    "machine": "a",
                    "level": "critical",
                    "message": "llama failed",
                    "fired_at": 11.0,
                },
            ]
        },
    )
    state.set_link("b", "offline", "connection refused")
    state.machines["b"].last_seen = 1000.0
    state.set_link("c", "offline", "connection refused")
    state.machines["c"].last_seen = 1020.0
    by = alerts_by_target(state, now=1040.0)
    assert [a.id for a in by[("a", "gpu0")]] == [a.id for a in by[("a", "job 3")]] == ["a-1"]
    assert [a.id for a in by[("a", "model llama")]] == ["a-2"]
    assert [a.message for a in by[("b", "machine")]] == ["b is offline: connection refused"]
    assert ("c", "machine") not in by  # offline for 20 s only: not yet an alert


async def test_an_alert_firing_when_the_agent_stops_is_still_active_after_a_restart(tmp_path):
    from agents.alerts.component import AlertsComponent
    from agents.runtime.store import Store
    from agents.shell.agent import Agent
    from agents.wire.lab.model import parse_lab

    lab = parse_lab(
        "lab: t\nalerts: {temp_for_s: 0, clear_for_s: 0}\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"
    )

    async def agent_with_alerts() -> tuple[Agent, AlertsComponent]:
        agent = Agent(lab, "box", tmp_path, components=lambda core: [AlertsComponent(core)])
        component = agent.find(AlertsComponent)
        assert component is not None
        agent.store = Store(tmp_path / "state.db")
        await agent.start_components()
        return agent, component

    agent, alerts = await agent_with_alerts()
    agent.gpus.override(0, temp_c=99.0)
    agent.tick()
    (fired,) = alerts.section().to_wire()["active"]
    agent.store.close()

    agent, alerts = await agent_with_alerts()  # a new process on the same state
    assert [a.id for a in alerts.section().active] == [fired["id"]] == ["box#1"]
    agent.gpus.override(0, temp_c=99.0)
    agent.tick()  # still hot: the same alert, not a second one
    assert [a.id for a in alerts.section().active] == ["box#1"]
    agent.gpus.override(0, temp_c=40.0)
    agent.tick()
    assert alerts.section().active == [] and alerts.section().recent[0].id == "box#1"
    agent.store.close()


async def test_an_alert_is_acked_by_its_id_and_by_the_form_ids_had_before(tmp_path):
    """Ids are "<machine>#<n>"; state.db keeps only n, so every stored alert has one. A console of the previous
    version still sends "<machine>-<n>": the agent takes it. Anything else is invalid params, naming the form."""
    from agents.alerts.component import AlertsComponent
    from agents.runtime.rpc import Peer
    from agents.runtime.store import Store
    from agents.shell.agent import Agent
    from agents.wire.lab.model import parse_lab
    from agents.wire.protocol import Role

    lab = parse_lab(
        "lab: t\nalerts: {temp_for_s: 0, clear_for_s: 0}\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"
    )
    agent = Agent(lab, "box", tmp_path, components=lambda core: [AlertsComponent(core)])
    alerts = agent.find(AlertsComponent)
    assert alerts is not None
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    peer = Peer(role=Role.OPERATOR, who="test", send=lambda line: None)

    async def ack(alert_id: str) -> dict:
        return await agent.rpc.dispatch(peer, {"id": 1, "method": "alerts.ack", "params": {"id": alert_id}})

    agent.gpus.override(0, temp_c=99.0)
    agent.tick()
    (fired,) = alerts.section().active
    assert fired.id == "box#1"
    assert (await ack("box#1"))["result"]["acked"] is True
    assert alerts.section().active[0].acked and alerts.section().unacked == 0
    assert (await ack("box-1"))["result"]["id"] == "box#1"  # the previous form: the same alert
    for bad in ("nosuch", "box-x", "box#", "#1", "box#offline"):
        error = (await ack(bad))["error"]
        assert error["code"] == "invalid_params" and "<machine>#<n>" in error["message"] and "box#12" in error["message"], (
            bad,
            error,
        )
    error = (await ack("m5#1"))["error"]
    assert error["code"] == "not_found" and "'m5'" in error["message"]
    error = (await ack("box#99"))["error"]
    assert error["code"] == "not_found" and "box#99" in error["message"]
    assert (await agent.rpc.dispatch(peer, {"id": 2, "method": "ping"}))["result"]["t"] > 0  # and it keeps serving
    agent.store.close()
