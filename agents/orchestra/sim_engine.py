"""The sim engine: runs agents.orchestra.sim_server, a real HTTP process with simulated delays.

It is started the way vLLM is (the same `serve` flags and environment, from VllmSleepMixin),
and the server holds vLLM's contract, so a regression in either shows in the tests.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from agents.orchestra.engine import Engine, VllmSleepMixin
from agents.orchestra.vllm import VLLM_SPEC


class SimEngine(VllmSleepMixin, Engine):
    spec = dataclasses.replace(
        VLLM_SPEC, name="sim", title="vLLM (simulated)", simulated=True, min_compute_capability=None, gpu_stack="sim"
    )

    def argv(self) -> list[str]:
        sim = self.model.sim
        argv = [
            sys.executable,
            "-m",
            "agents.orchestra.sim_server",
            str(self.path),
            *self.serve_flags(),
            "--load-s",
            str(sim.load_s),
            "--cold-factor",
            str(sim.cold_factor),
            "--warmup-s",
            str(sim.warmup_s),
            "--wake-s",
            str(sim.wake_s),
            "--tokens-per-s",
            str(sim.tokens_per_s),
            "--traffic-rps",
            str(sim.traffic_rps),
        ]
        # follow the agent that owns the state dir, not just our parent, so a restarted agent can re-adopt us
        argv += ["--agent-pid-file", str(self.agent_pid_file)] if self.agent_pid_file else ["--parent-pid", str(os.getpid())]
        if sim.fail_after_s is not None:
            argv += ["--fail-after-s", str(sim.fail_after_s)]
        return argv
