"""`cetlab sim-override`: script a scenario on a simulated machine (a hot GPU, a full one); real GPUs refuse it."""

from __future__ import annotations

import argparse
from typing import Any

from agents.wire.catalogue.agent import SIM_OVERRIDE, OverrideParams, SimOverride
from console.cli.main import Context
from console.lab.replies import sent

EXIT_OK = 0
OVERRIDES = ("temp_c", "util_pct", "mem_used_bytes", "power_w")


def override_human(machine: str, result: SimOverride) -> str:
    return f"{machine} gpu{result.gpu} (SIM): " + (
        ", ".join(f"{k} {v}" for k, v in result.overrides.items()) or "back to the simulation"
    )


async def cmd_sim_override(ctx: Context) -> int:
    # checked here before it goes out (nan, inf, out of range: invalid_params naming the field, as the agent would say it)
    given: dict[str, Any] = {key: getattr(ctx.args, key) for key in OVERRIDES if getattr(ctx.args, key) is not None}
    params = OverrideParams(gpu=ctx.args.gpu, clear=ctx.args.clear, **given)
    result = await ctx.request(ctx.args.machine, SIM_OVERRIDE, params)
    ctx.out(sent(result), lambda _: override_human(ctx.args.machine, result))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sim-override", help="simulated GPUs: force a GPU's temperature, utilisation, VRAM or power (--clear: back)"
    )
    p.add_argument("machine")
    p.add_argument("--gpu", type=int, default=0, help="the GPU's index (default 0)")
    p.add_argument("--temp-c", type=float, dest="temp_c")
    p.add_argument("--util-pct", type=float, dest="util_pct")
    p.add_argument("--mem-used-bytes", type=int, dest="mem_used_bytes")
    p.add_argument("--power-w", type=float, dest="power_w")
    p.add_argument("--clear", action="store_true", help="drop this GPU's overrides first (alone: back to the simulation)")
    p.set_defaults(func=cmd_sim_override)
