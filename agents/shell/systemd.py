"""systemd integration: sd_notify (READY, STATUS, WATCHDOG) and the agent's unit file."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.replicas import models_on
from agents.wire.states import JOB_ACTIVE, ModelState

if TYPE_CHECKING:
    from agents.shell.agent import Agent
    from agents.wire.lab.model import Lab

log = logging.getLogger("cetlab.systemd")

WATCHDOG_S = 30  # WatchdogSec of the unit at least; the agent pings every half of it
UNIT_NAME = "cetlab-agent.service"
NOFILE_LIMIT = 65536  # consoles, engines' sockets, log followers, page-cache reads: far over the default 1024
# Caches the agent's children write (Hugging Face, vLLM's compile cache, Triton, Inductor); under
# ProtectHome=read-only the defaults in ~/.cache are read-only, so they move to a writable folder.
# FlashInfer's JIT kernels, vLLM's config root and CUDA's kernel cache (~/.nv) would otherwise also land in ~/.
CACHE_ENV = {
    "XDG_CACHE_HOME": "",
    "HF_HOME": "huggingface",
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "VLLM_CONFIG_ROOT": "vllm-config",
    "CUDA_CACHE_PATH": "nv",
}


class Notifier:
    """sd_notify(3) over $NOTIFY_SOCKET; does nothing when not started by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env  # a test's own environment, else the process's
        address = env.get("NOTIFY_SOCKET") or None
        if address and address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        self.address = address
        usec = env.get("WATCHDOG_USEC", "")
        # WATCHDOG_PID names the process the watchdog is meant for; a child that inherits the env is not it
        for_us = env.get("WATCHDOG_PID", str(os.getpid())) == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and for_us else None
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: Any) -> None:
        """One datagram of KEY=value lines, e.g. send(READY=1, STATUS="serving")."""
        if self.address is None:
            return
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            self._sock.sendto(message, self.address)
        except OSError as exc:  # systemd gone or the socket unreachable: keep serving, say so once per message
            log.warning("sd_notify to %s failed: %s", self.address.lstrip("\0"), exc)

    async def run(self, agents: list[Agent]) -> None:
        """Keep systemd told: STATUS when it changes, WATCHDOG=1 every WatchdogSec/2 while the telemetry loop ticks."""
        period_s = self.watchdog_s / 2 if self.watchdog_s else 5.0
        # a tick every sample_interval_s: a slow sampler (60 s) is not a stuck one until two intervals pass
        stall_s = (
            max(self.watchdog_s or 0.0, *(stall_allowance_s(a.interval_s) for a in agents)) if agents else self.watchdog_s or 0.0
        )
        status = ""
        ticks = [a.ticks for a in agents]
        ticked_at = time.monotonic()
        while True:
            await asyncio.sleep(period_s)
            now_ticks = [a.ticks for a in agents]
            if now_ticks != ticks:
                ticks, ticked_at = now_ticks, time.monotonic()
            new_status = status_line(agents)
            fields: dict[str, Any] = {}
            if new_status != status:
                status = fields["STATUS"] = new_status
            if self.watchdog_s:
                # a stuck telemetry loop (a hung NVML call) stops the pings too, so systemd restarts us
                if time.monotonic() - ticked_at < stall_s:
                    fields["WATCHDOG"] = 1
                else:
                    log.error(
                        "no telemetry tick for %.0f s: letting the watchdog restart the agent", time.monotonic() - ticked_at
                    )
            if fields:
                self.send(**fields)


def stall_allowance_s(sample_interval_s: float) -> float:
    """How long the telemetry loop may go without a tick before it counts as stuck: two sample intervals."""
    return 2 * sample_interval_s


def watchdog_sec(sample_interval_s: float) -> int:
    """The unit's WatchdogSec: WATCHDOG_S, or two sample intervals where that is longer."""
    return max(WATCHDOG_S, math.ceil(stall_allowance_s(sample_interval_s)))


def nvidia_modprobe() -> str | None:
    """nvidia-modprobe, which loads nvidia_uvm on demand (setuid: NoNewPrivileges stops it inside the unit)."""
    return shutil.which("nvidia-modprobe", path="/usr/bin:/usr/sbin:/bin:/sbin")


def status_line(agents: list[Agent]) -> str:
    """One line for `systemctl status`: e.g. "3 consoles, 2 jobs, 1 model warm, 5 GPUs, sampling 1 Hz"."""
    consoles = jobs = warm = gpus = failed = 0
    for agent in agents:
        consoles += sum(1 for p in agent.peers if not p.closed)
        current = agent.current  # the typed sections of the latest tick
        jobs += sum(1 for job in current.get("jobs") or [] if job.state in JOB_ACTIVE)
        models = current.get("models")
        warm += sum(1 for model in models.models if model.state == ModelState.WARM) if models is not None else 0
        if agent.latest is not None:
            gpus += len(agent.latest.gpus)
            failed += sum(1 for g in agent.latest.gpus if g.failed)
    hz = 1 / agents[0].interval_s if agents else 0
    parts = [
        f"{consoles} console{'s' * (consoles != 1)}",
        f"{jobs} job{'s' * (jobs != 1)}",
        f"{warm} model{'s' * (warm != 1)} warm",
        f"{gpus} GPU{'s' * (gpus != 1)}" + (f" ({failed} failed)" if failed else ""),
        f"sampling {hz:g} Hz",
    ]
    if agents and agents[0].simulated:
        parts.append("SIMULATED GPUs")
    return ", ".join(parts)


# ---------------------------------------------------------------------------- the unit file


def _writable_paths(lab: Lab, machine: str, state_dir: Path) -> list[str]:
    """What the agent and its children write: the state dir (must exist) and trainers' outputs ('-': may not exist yet)."""
    paths = [str(state_dir)]
    for trainer in lab.trainers:
        if trainer.machine != machine:
            continue
        for raw in (trainer.output_dir, *trainer.checkpoint_dirs):
            fixed = raw.split("{", 1)[0]
            if fixed != raw:  # {job_id} differs per run: open the folder above it
                fixed = fixed.rpartition("/")[0] or "."
            paths.append(f"-{lab.resolve(fixed)}")
    for model in models_on(lab, machine):
        if model.make_tiny_if_missing or model.sim.placeholder_mib:
            resolved = lab.resolve(model.path)
            if resolved is not None:
                paths.append(f"-{resolved.parent}")
    return list(dict.fromkeys(paths))


def agent_command() -> list[str]:
    """How systemd starts the agent: the installed console script beside this Python, else -m."""
    script = Path(sys.executable).with_name("cetlab-agent")
    if script.exists():
        return [str(script)]
    found = shutil.which("cetlab-agent")
    return [found] if found else python_agent(sys.executable)


def render_unit(
    lab: Lab,
    lab_path: Path,
    machine: str,
    state_dir: Path,
    *,
    user_unit: bool,
    run_as: str | None,
    unix_socket: Path | None = None,
    cache_dir: Path | None = None,
) -> str:
    """The unit text. Hardening leaves /dev alone: no PrivateDevices, no DeviceAllow, so /dev/nvidia* stay usable.

    ``cache_dir`` (default STATE_DIR/cache) holds the Hugging Face, vLLM, Triton and Inductor caches of a system unit.
    """
    argv = agent_argv(agent_command(), lab_path, machine, state_dir, keep_engines=True, unix_socket=unix_socket)
    interval_s = next((m.sample_interval_s for m in lab.machines if m.name == machine), 1.0)
    modprobe = nvidia_modprobe()
    lines = [
        "# Written by `cetlab-agent install-unit`. Local changes: `systemctl edit` (a drop-in), not this file.",
        "[Unit]",
        f"Description=cetlab agent for {machine} (GPU telemetry, trainers, model servers)",
        # the persistence daemon (where installed) has the driver initialised before CUDA's first use
        "After=network-online.target" + ("" if user_unit else " nvidia-persistenced.service"),
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
    ]
    if modprobe:  # '+': with full privileges (NoNewPrivileges and the sandbox would stop it); '-': its failure is not ours
        lines.append(f"ExecStartPre=+-{modprobe} -u -c=0")
    lines += [
        f"ExecStart={shlex.join(argv)}",
        "Environment=PYTHONUNBUFFERED=1",
        "Environment=VLLM_NO_USAGE_STATS=1",  # no usage report to vLLM's servers from a lab box
        "Restart=on-failure",
        "RestartSec=5",
        f"WatchdogSec={watchdog_sec(interval_s)}",
        "TimeoutStartSec=120",
        "TimeoutStopSec=30",
        "# Only the agent is stopped: trainers and model servers keep running and the next agent re-adopts them.",
        "KillMode=process",
        f"LimitNOFILE={NOFILE_LIMIT}",
        "UMask=0027",  # what the agent and its children write: the group may read (shared run folders), others not
        "NoNewPrivileges=yes",
    ]
    if not user_unit:  # filesystem sandboxing needs the system manager (a user manager cannot set up the mounts)
        if run_as:
            lines.append(f"User={run_as}")
        if state_dir.is_relative_to("/var/lib"):  # systemd creates it, owned by User=, before the start
            lines += [f"StateDirectory={state_dir.relative_to('/var/lib')}", "StateDirectoryMode=0700"]
        cache = cache_dir or state_dir / "cache"
        writable = _writable_paths(lab, machine, state_dir)
        if not cache.is_relative_to(state_dir):
            writable.append(f"-{cache}")
        lines += [
            # every tool's temp files need a writable /tmp of their own; a kept engine outlives this one (deleted at
            # the agent's stop), so engines get their own temp, IPC and metrics folders under the state dir instead
            "PrivateTmp=yes",
            *(f"Environment={name}={cache / sub if sub else cache}" for name, sub in CACHE_ENV.items()),
            "ProtectSystem=strict",
            "ProtectHome=read-only",
            f"ReadWritePaths={' '.join(writable)}",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
            "RestrictSUIDSGID=yes",
            "RestrictRealtime=yes",
            "LockPersonality=yes",
            "# No PrivateDevices=, DevicePolicy= or ProtectClock= (each closes /dev): the GPUs are /dev/nvidia*.",
        ]
    lines += ["", "[Install]", f"WantedBy={'default.target' if user_unit else 'multi-user.target'}", ""]
    return "\n".join(lines)


TMP_ROOTS = (Path("/tmp"), Path("/var/tmp"))


def tmp_path_warnings(
    lab: Lab,
    lab_path: Path,
    machine: str,
    state_dir: Path,
    cache_dir: Path | None,
    *,
    user_unit: bool,
    program: Path | None = None,
) -> list[str]:
    """Paths of the unit under /tmp or /var/tmp: under PrivateTmp the agent sees its own empty /tmp (deleted when it
    stops), and even without it /tmp is cleaned at boot: the agent's program (ExecStart=, ``program``: the one this
    Python would install, a virtualenv made under /tmp), the lab, the state (keys, ledger) or outputs would be lost."""
    named = [
        ("ExecStart='s program", program or Path(agent_command()[0])),
        ("the lab file", lab_path),
        ("the state dir", state_dir),
    ]
    if cache_dir is not None:
        named.append(("the cache dir", cache_dir))
    for trainer in lab.trainers:
        output = lab.resolve(trainer.output_dir.split("{", 1)[0] or ".")
        if trainer.machine == machine and output is not None:
            named.append((f"trainer {trainer.name}'s output_dir", output))
    why = (
        "the unit's PrivateTmp gives the agent a /tmp of its own, deleted when it stops"
        if not user_unit
        else "/tmp is cleaned at boot"
    )
    return [
        f"{what} {path} is under {root}: {why}; move it (e.g. under /var/lib or /srv)"
        for what, path in named
        for root in TMP_ROOTS
        if Path(path).resolve().is_relative_to(root)
    ]


def unit_path(user_unit: bool) -> Path:
    if user_unit:
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return config / "systemd" / "user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def enable_commands(user_unit: bool, path: Path) -> list[str]:
    ctl = "systemctl --user" if user_unit else "sudo systemctl"
    commands = [
        f"{ctl} daemon-reload",
        f"{ctl} enable --now {UNIT_NAME}",
        f"{'journalctl --user' if user_unit else 'journalctl'} -u {UNIT_NAME} -f",
    ]
    if user_unit:  # without lingering a user's services stop at logout
        commands.insert(0, f"sudo loginctl enable-linger {os.environ.get('USER', '$USER')}")
    return [f"systemd-analyze verify {path}", *commands]
