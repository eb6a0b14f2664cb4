"""`cetlab sim-override`: script a scenario on a simulated machine (a hot GPU, a full one); real GPUs refuse it."""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OK = 0


async def cmd_sim_override(ctx: Any) -> int:
    params: dict[str, Any] = {"gpu": ctx.args.gpu, "clear": ctx.args.clear}
    for key in ("temp_c", "util_pct", "mem_used_bytes", "power_w"):
        value = getattr(ctx.args, key)
        if value is not None:
            params[key] = value
    result = await ctx.call(ctx.args.machine, "sim.override", params)
    ctx.out(result, lambda r: f"{ctx.args.machine} gpu{r['gpu']} (SIM): " + (", ".join(f"{k} {v}" for k, v in r["overrides"].items())
                                                                             or "back to the simulation"))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim-override", help="simulated GPUs: force a GPU's temperature, utilisation, VRAM or power (--clear: back)")
    p.add_argument("machine")
    p.add_argument("--gpu", type=int, default=0, help="the GPU's index (default 0)")
    p.add_argument("--temp-c", type=float, dest="temp_c")
    p.add_argument("--util-pct", type=float, dest="util_pct")
    p.add_argument("--mem-used-bytes", type=int, dest="mem_used_bytes")
    p.add_argument("--power-w", type=float, dest="power_w")
    p.add_argument("--clear", action="store_true", help="drop this GPU's overrides first (alone: back to the simulation)")
    p.set_defaults(func=cmd_sim_override)
