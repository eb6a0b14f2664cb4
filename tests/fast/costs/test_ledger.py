"""The energy ledger and money: hand-computed sequences, attribution, tokens, prices, persistence across kill -9."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest

from agents.costs.component import JOULES_PER_KWH, Ledger, Prices, Reading, gpu_holders, price, readings, token_counts
from agents.runtime.store import Store

# ---------------------------------------------------------------------------- real agents over SSH
# ---------------------------------------------------------------------------- the console
from agents.wire.lab.model import (
    LabError,
    parse_lab,
)
from agents.wire.protocol import GpuSample, Telemetry
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo
from tests.support.costs_header import header
from tests.support.waits import wait_for

UTC = UTC


DAY = "1970-01-01"


def ledger(tmp_path: Path, interval_s: float = 1.0) -> Ledger:
    return Ledger(Store(tmp_path / "state.db"), interval_s, UTC)


def sample(gpu_w: float, owner: tuple[str, str] = ("job", "1"), busy: bool = True, host_w: float = 100.0) -> dict[str, Reading]:
    return {
        "host": Reading("host", "host", power_w=host_w),
        "gpu0": Reading(owner[0], owner[1], "Tesla V100", power_w=gpu_w, busy=busy, rent_share=1.0),
    }


def totals(lg: Ledger) -> dict[tuple, dict]:
    return {(r["kind"], r["owner"]): r for r in lg.rows()}


def test_trapezoid_with_owner_change_gaps_and_clock_jumps(tmp_path):
    lg = ledger(tmp_path)
    lg.add(0.0, sample(200))
    lg.add(1.0, sample(300))  # job 1: 200*.5 + 300*.5 = 250 J; host 100 J
    lg.add(2.0, sample(100, ("other", "gpu0"), busy=False))  # job 1: 150 J, other: 50 J; host 100 J
    lg.add(10.0, sample(999))  # gap of 8 s > 3 intervals: nothing
    lg.add(11.0, sample(1))  # job 1: (999 + 1) / 2 = 500 J; host 100 J
    lg.add(5.0, sample(1))  # clock went backwards: nothing
    lg.add(6.5, sample(3))  # 1.5 s: job 1 (1 + 3) / 2 * 1.5 = 3 J; host 150 J
    lg.add(9.5, sample(50))  # exactly 3 intervals still counts: (3 + 50) / 2 * 3 = 79.5 J; host 300 J
    rows = totals(lg)
    assert rows[("job", "1")]["energy_j"] == pytest.approx(250 + 150 + 500 + 3 + 79.5)
    assert rows[("job", "1")]["held_s"] == pytest.approx(1 + 0.5 + 1 + 1.5 + 3)
    assert rows[("job", "1")]["busy_s"] == pytest.approx(1 + 0.5 + 1 + 1.5 + 3)
    assert rows[("other", "gpu0")]["energy_j"] == pytest.approx(50)
    assert rows[("other", "gpu0")]["busy_s"] == 0
    assert rows[("host", "host")]["energy_j"] == pytest.approx(100 + 100 + 100 + 150 + 300)
    assert rows[("host", "host")]["up_s"] == pytest.approx(1 + 1 + 1 + 1.5 + 3)
    assert rows[("job", "1")]["rent_s"] == pytest.approx(7.0)  # the only GPU carries the whole rent


def test_restart_keeps_the_totals_and_does_not_bridge_the_downtime(tmp_path):
    lg = ledger(tmp_path)
    lg.add(0.0, sample(200))
    lg.add(1.0, sample(200))
    lg.store.close()
    lg = ledger(tmp_path)  # a new process on the same database
    lg.add(2.0, sample(200))  # first sample after the restart: no interval to close
    assert totals(lg)[("job", "1")]["energy_j"] == pytest.approx(200)
    lg.add(3.0, sample(200))
    assert totals(lg)[("job", "1")]["energy_j"] == pytest.approx(400)


def test_days_follow_the_lab_time_zone(tmp_path):
    lg = ledger(tmp_path)
    lg.add(86400 - 0.5, sample(100))
    lg.add(86400 + 0.5, sample(100))  # the interval ends on the next UTC day
    assert {r["day"] for r in lg.rows()} == {"1970-01-02"}
    tokyo = Ledger(Store(tmp_path / "tokyo.db"), 1.0, __import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    tokyo.add(14 * 3600.0, sample(100))
    tokyo.add(15 * 3600.0 + 0.5, sample(100))
    tokyo.add(15 * 3600.0 + 1.0, sample(100))  # 00:00:01 in Tokyo on Jan 2
    assert {r["day"] for r in tokyo.rows()} == {"1970-01-02"}


def test_the_console_counts_days_in_the_lab_time_zone_not_its_own():
    """23:30 UTC is already tomorrow in Berlin: the agents book tomorrow, so the plot's last bar is tomorrow too (the
    console took its workstation's date, and the day's spend was off the plot for an hour every night)."""
    from datetime import date

    from agents.wire.lab.model import Costs
    from console.lab.costs import LabDay
    from console.tui.screens.costs import first_day, plot_days

    late = 86400 * 20000 + 23.5 * 3600  # 2024-10-04 23:30 UTC
    berlin, here = Costs(timezone="Europe/Berlin"), Costs(timezone="UTC")  # here: a workstation in UTC
    assert (berlin.day(late), here.day(late)) == (date(2024, 10, 5), date(2024, 10, 4))
    booked = [LabDay(day="2024-10-05", api=0.0, cost=0.5, cloud_equivalent=1.0, kwh=0.1)]
    today = berlin.day(late)
    assert plot_days(booked, first_day(None, today), today)[-1] == ("10-05", 0.5, 1.0)
    assert plot_days(booked, first_day(None, here.day(late)), here.day(late))[-1][1] == 0.0  # the old mistake


def test_tokens_count_deltas_and_survive_counter_resets_and_restarts(tmp_path):
    lg = ledger(tmp_path)
    lg.add(0.0, {}, {"llama": 100})  # first sight: a baseline, not served in this ledger's time
    lg.add(1.0, {}, {"llama": 150})
    lg.add(2.0, {}, {"llama": 20})  # engine restarted: its counter began again at 0
    lg.store.close()
    lg = ledger(tmp_path)
    lg.add(3.0, {}, {"llama": 50})  # the mark survived the agent's restart
    assert totals(lg)[("model", "llama")]["tokens"] == 50 + 20 + 30


def prices(**overrides) -> Prices:
    base = dict(
        currency="USD", electricity_per_kwh=0.15, hourly_rate=0.0, gpu_hour={"Tesla V100": 2.48}, token_price={"llama": 0.2}
    )
    return Prices(**{**base, **overrides})


def row(kind="job", owner="1", gpu_name="Tesla V100", energy_j=0.0, up_s=0.0, held_s=0.0, busy_s=0.0, rent_s=0.0, tokens=0.0):
    return dict(
        day=DAY,
        kind=kind,
        owner=owner,
        gpu_name=gpu_name,
        label="",
        energy_j=energy_j,
        up_s=up_s,
        held_s=held_s,
        busy_s=busy_s,
        rent_s=rent_s,
        tokens=tokens,
    )


def test_money_cloud_equivalent_and_saving():
    rows = [
        row("host", "host", "", energy_j=JOULES_PER_KWH, up_s=3600),  # 1 kWh idle
        row("job", "1", energy_j=2 * JOULES_PER_KWH, held_s=7200, busy_s=3600),  # 2 kWh, 1 busy GPU-hour
        row("model", "llama", energy_j=JOULES_PER_KWH, held_s=3600, busy_s=3600),  # priced by tokens, not GPU time
        row("model", "llama", "", tokens=5_000_000),
    ]
    money = price(rows, prices())
    assert money["kwh"] == pytest.approx(4.0)
    assert money["cost"] == pytest.approx(0.60)
    assert money["cloud_gpu"] == pytest.approx(2.48)
    assert money["cloud_tokens"] == pytest.approx(1.0)
    assert money["cloud_equivalent"] == pytest.approx(3.48)
    assert money["saving"] == pytest.approx(2.88)
    assert money["saving_pct"] == pytest.approx(2.88 / 3.48 * 100, abs=0.01)
    assert money["gpu_hours"] == pytest.approx(3.0) and money["gpu_busy_hours"] == pytest.approx(2.0)
    assert money["missing"] == []


def test_only_the_labs_own_work_counts_toward_the_cloud_equivalent():
    """A GPU busy with work no job or model of the lab holds (another user's, a SIM background load) would not
    move to the cloud: it costs energy here, and no cloud equivalent (once it inflated "saving 95%")."""
    rows = [row("job", "1", busy_s=3600), row("other", "gpu0", energy_j=JOULES_PER_KWH, held_s=3600, busy_s=3600)]
    money = price(rows, prices())
    assert money["cloud_gpu"] == pytest.approx(2.48)  # the job's busy hour only
    assert money["kwh"] == pytest.approx(1.0) and money["gpu_busy_hours"] == pytest.approx(2.0)


def test_local_tokens_are_compared_at_the_labs_own_providers_prices():
    lab = parse_lab("""
lab: t
machines: [{name: m, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]
cloud_prices: {tokens_per_million: {llama-3.1-70b: 0.50, phi-3-mini: 0.10}}
models:
  - {name: big, path: m/big, engine: sim, machine: m, gpus: [0], cloud_equivalent: llama-3.1-70b}
  - {name: small, path: m/small, engine: sim, machine: m, gpus: [0], cloud_equivalent: phi-3-mini}
providers:
  - {name: p, base_url: "http://127.0.0.1:1/v1", models: [{name: llama-3.1-70b, prompt_per_million: 0.80, completion_per_million: 1.00}]}
""")
    token_price = Prices.of(lab, lab.machines[0]).token_price
    assert token_price == {
        "big": pytest.approx(0.90),
        "small": 0.10,
    }  # the provider's (mean of prompt and completion), else cloud_prices


def test_rented_machine_pays_rent_by_uptime_not_power():
    rows = [row("host", "host", "", energy_j=JOULES_PER_KWH, up_s=7200), row(energy_j=JOULES_PER_KWH, held_s=7200, rent_s=7200)]
    money = price(rows, prices(hourly_rate=2.5, electricity_per_kwh=None))
    assert money["cost"] == pytest.approx(5.0) and money["energy_cost"] == 0.0 and money["missing"] == []


def test_missing_prices_are_named_instead_of_a_wrong_number():
    rows = [row("host", "host", "", energy_j=JOULES_PER_KWH), row(gpu_name="Tesla P4", busy_s=3600)]
    money = price(rows, prices(electricity_per_kwh=None))
    assert money["cost"] is None and money["cloud_equivalent"] is None and money["saving_pct"] is None
    assert money["missing"] == ["missing: costs.electricity_per_kwh", "no cloud price for GPU 'Tesla P4'"]
    idle_p4 = price([row(gpu_name="Tesla P4", held_s=3600)], prices())
    assert idle_p4["cloud_equivalent"] == 0.0 and idle_p4["missing"] == []  # never busy: no price needed


def test_attribution_from_jobs_and_models_sections():
    def job(id_: str, gpus: list[int], state: str, recipe: str) -> JobInfo:
        return JobInfo(id=id_, recipe=recipe, machine="m", gpus=gpus, state=state, started_at=1.0, output_dir="/o", log_path="/l")

    def model(name: str, gpus: list[int], state: str, **counters: float) -> ModelInfo:
        return ModelInfo(name=name, machine="m", engine="vllm", gpus=gpus, state=state, since=1.0, **counters)

    jobs = [job("3", [0], "running", "cet-d"), job("4", [1], "exited", "cet-d")]
    models = [
        model("llama", [1, 2], "warm", prompt_tokens_total=1000, generation_tokens_total=234),
        model("phi", [3], "sleeping"),
    ]
    holders = gpu_holders(jobs, models)
    assert holders == {0: ("job", "3", "cet-d"), 1: ("model", "llama", "llama"), 2: ("model", "llama", "llama")}
    assert gpu_holders([], []) == {}
    assert token_counts(models) == {"llama": 1234.0}  # phi's engine reports no counters: no count rather than zero
    assert token_counts([model("x", [], "warm", generation_tokens_total=float("nan"))]) == {}  # a NaN counter is no count

    lab = parse_lab(
        "lab: t\nmachines: [{name: m, idle_watts: 50, gpus: {sim: [{name: G, memory_gib: 8, tdp_w: 100}, {name: G, memory_gib: 8, tdp_w: 100}, {name: G, memory_gib: 8, tdp_w: 100}, {name: G, memory_gib: 8, tdp_w: 100}]}}]\n"
    )
    gpus = [GpuSample(index=i, name="G", power_w=10.0 * (i + 1), util_pct=50.0 * i) for i in range(4)]
    out = readings(Telemetry(machine="m", t=0.0, gpus=gpus), lab.machines[0], holders)
    assert out["host"].power_w == 50 and out["host"].rent_share == 0.0
    assert (out["gpu0"].kind, out["gpu0"].owner, out["gpu0"].busy) == ("job", "3", False)
    assert (out["gpu2"].kind, out["gpu2"].owner, out["gpu2"].power_w) == ("model", "llama", 30.0)
    assert (out["gpu3"].kind, out["gpu3"].owner) == ("other", "gpu3")
    assert sum(r.rent_share for r in out.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            "costs: {electricity_per_kwh: -0.1}",
            "lab.yaml:2: costs.electricity_per_kwh: Input should be greater than or equal to 0",
        ),
        ("costs: {electricity_per_kwh: cheap}", "lab.yaml:2: costs.electricity_per_kwh: Input should be a valid number"),
        (
            "cloud_prices: {gpu_hour: {V100: -2}}",
            "lab.yaml:2: cloud_prices.gpu_hour.V100: Input should be greater than or equal to 0",
        ),
        ("costs: {timezone: Mars/Olympus}", "lab.yaml:2: costs.timezone: unknown time zone 'Mars/Olympus'"),
    ],
)
def test_bad_prices_are_load_errors_with_file_and_line(bad, message):
    with pytest.raises(LabError) as info:
        parse_lab(f"lab: t\n{bad}\nmachines: [{{name: m, hourly_rate: 1}}]\n")
    assert str(info.value).startswith(message)
    with pytest.raises(LabError, match=r"lab.yaml:3: machines\[0\].hourly_rate: Input should be greater than or equal to 0"):
        parse_lab("lab: t\nmachines:\n  - {name: m, hourly_rate: -2.5}\n")


def test_the_labs_sums_are_typed_and_print_as_the_json_cetlab_costs_always_printed():
    """console.lab.costs.LabCosts: the screen and the CLI read attributes; `--json` keeps its keys, its order, the machines'
    rows as they sent them, and the int 0 of a sum over nothing (a lab without a gateway has no API spend)."""
    from agents.wire.catalogue.costs import COSTS_GET
    from agents.wire.catalogue.method import validate_reply
    from agents.wire.protocol import ErrorCode, RemoteError
    from console.lab.costs import LabCosts, LabDay, lab_costs

    box = validate_reply(
        COSTS_GET,
        {
            "machine": "box",
            "currency": "EUR",
            "timezone": "UTC",
            "simulated": True,
            "now": {"power_w": 300.0, "per_hour": 0.09},
            "today": {"kwh": 1.5, "cost": 0.45, "cloud_equivalent": 3.0},
            "month": {"kwh": 10.0, "cost": 3.0, "cloud_equivalent": 20.0},
            "since": {"day": "2026-11-01", "cost": 3.0, "cloud_equivalent": 20.0},
            "by": [{"machine": "box", "kwh": 10.0, "cost": 3.0}],
            "days": [{"day": "2026-11-24", "cost": 0.45, "cloud_equivalent": 3.0, "kwh": 1.5}],
        },
    )
    report = lab_costs("EUR", {"box": box, "gone": RemoteError(ErrorCode.DISCONNECTED, "gone is offline")}, "machine")
    assert isinstance(report, LabCosts) and report.saving_month == 17.0 and report.offline == {"gone": "gone is offline"}
    assert report.days == [LabDay(day="2026-11-24", api=0.0, cost=0.45, cloud_equivalent=3.0, kwh=1.5)]
    data = report.to_json()
    assert list(data) == [
        "currency",
        "now_per_hour",
        "power_w",
        "today",
        "month",
        "kwh_today",
        "kwh_month",
        "cloud_equivalent_today",
        "cloud_equivalent_month",
        "saving_month",
        "saving_pct_month",
        "since",
        "since_total",
        "cloud_equivalent_since",
        "saving_pct_since",
        "api_providers",
        "api_today",
        "api_month",
        "api_since",
        "total_month",
        "by_kind",
        "by",
        "days",
        "missing",
        "offline",
        "simulated",
    ]
    assert data["by"] == [{"machine": "box", "kwh": 10.0, "cost": 3.0}]  # as the machine sent it
    assert data["days"] == [{"day": "2026-11-24", "api": 0.0, "cost": 0.45, "cloud_equivalent": 3.0, "kwh": 1.5}]
    assert type(data["api_month"]) is int and data["api_month"] == 0 and data["total_month"] == 3.0
    assert data["since"] == "2026-11-01" and data["simulated"] is True


@pytest.mark.timeout(60)
async def test_header_names_the_missing_price(in_process):
    lab = await in_process()
    app = lab.app()
    async with app.run_test(size=(160, 50)):
        await wait_for(lambda: "cost - (" in header(app), timeout=30)  # "-": the one marker of a figure nobody can give
        assert "missing: costs.electricity_per_kwh" in header(app)
