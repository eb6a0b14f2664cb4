"""What `cetlab machine add` runs on the machine itself: the pre-flight script, its typed answer, and the remote commands.

The pre-flight is plain Python sent over ssh to the machine's python3 on stdin (nothing of cetlab is there yet). It
changes nothing; it answers one JSON object that names where each part of the install lives on that machine (the
layout is decided there, from its own home and user, in one place) and what of it is already done, so every step of
`machine add` can say "already done" and a second run continues where a failed one stopped.
"""

from __future__ import annotations

import json
import shlex

from pydantic import BaseModel, ConfigDict, Field

from agents.wire.agent_argv import agent_argv

UNIT = "cetlab-agent.service"
MIN_PYTHON = (3, 11)
MIN_FREE_BYTES = 2 * 1024**3  # the venv and wheelhouse take ~150 MB; runs, checkpoints and logs want the rest

# Which python3 the machine runs the pre-flight with: the newest 3.11+ on PATH, else plain python3 (it says its version)
FIND_PYTHON = (
    "PY=$(command -v python3.13 || command -v python3.12 || command -v python3.11 || command -v python3) "
    '|| { echo "no python3 on PATH" >&2; exit 127; }; exec "$PY" -'
)

PREFLIGHT = r"""
import hashlib, json, os, platform, pwd, shutil, socket, subprocess, sys, time

args = json.loads(sys.argv[1])
name, port, key = args["name"], int(args["port"]), args["key"]
home = os.path.expanduser("~")
uid = os.getuid()
base = os.path.join(home, ".local", "share", "cetlab")
state = "/var/lib/cetlab/" + name if uid == 0 else os.path.join(home, ".local", "state", "cetlab", "agent-" + name)
layout = {
    "home": home, "base": base, "venvs": base + "/venvs", "venv": base + "/venv",
    "wheelhouse": os.path.join(home, ".cache", "cetlab", "wheelhouse"), "lab": base + "/lab.yaml", "state": state,
}


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def sha(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def ran(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


pretty = None
for line in (read("/etc/os-release") or "").splitlines():
    if line.startswith("PRETTY_NAME="):
        pretty = line.split("=", 1)[1].strip('"')
try:
    import ensurepip, venv  # noqa: F401
    has_venv = True
except ImportError:
    has_venv = False

gpus, driver, nvidia_error = [], None, None
smi = shutil.which("nvidia-smi")
if smi is None:
    nvidia_error = "no nvidia-smi on PATH (no NVIDIA driver)"
else:
    out = ran([smi, "--query-gpu=index,name,compute_cap,memory.total,driver_version", "--format=csv,noheader,nounits"])
    if out is None or out.returncode != 0:
        nvidia_error = ((out.stderr or out.stdout).strip()[-400:] if out else "") or "nvidia-smi failed"
    else:
        for line in out.stdout.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 5:
                cc = parts[2] if parts[2][:1].isdigit() else None
                gpus.append({"index": int(parts[0]), "name": parts[1], "compute_capability": cc})
                driver = parts[4]

port_free = True
try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
except OSError:
    port_free = False

pid = read(state + "/agent.pid")
cmdline = read("/proc/%s/cmdline" % pid) if pid and pid.isdigit() else None
detached_running = bool(cmdline) and "cetlab-agent" in cmdline
systemd = os.path.isdir("/run/systemd/system")
sudo = uid == 0
if not sudo and shutil.which("sudo"):
    out = ran(["sudo", "-n", "true"])
    sudo = out is not None and out.returncode == 0
unit_active = False
if systemd and shutil.which("systemctl"):
    out = ran(["systemctl", *([] if sudo else ["--user"]), "is-active", "--quiet", "cetlab-agent.service"])
    unit_active = out is not None and out.returncode == 0

print(json.dumps({
    "os": platform.system(), "os_name": pretty, "arch": platform.machine(), "user": pwd.getpwuid(uid).pw_name,
    "uid": uid, "python": sys.executable, "python_version": list(sys.version_info[:3]), "has_venv": has_venv,
    "gpus": gpus, "driver": driver, "nvidia_error": nvidia_error, "disk_free_bytes": shutil.disk_usage(home).free,
    "time": time.time(), "port_free": port_free, "systemd": systemd, "sudo": sudo,
    "agent_running": detached_running or unit_active, "unit_active": unit_active, "layout": layout,
    "venv_key": read(layout["venv"] + "/.cetlab-key"),
    "wheelhouse_ready": os.path.exists(layout["wheelhouse"] + "/" + key + "/.complete"),
    "lab_sha256": sha(layout["lab"]),
}))
"""


class Layout(BaseModel):
    """Where each part lives on the machine (decided by the pre-flight there)."""

    model_config = ConfigDict(extra="forbid")
    home: str
    base: str
    venvs: str
    venv: str  # a link to the venv in use (venvs/KEY), switched by an upgrade
    wheelhouse: str
    lab: str
    state: str


class RemoteGpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    name: str
    compute_capability: str | None


class Preflight(BaseModel):
    """The machine's answer to the pre-flight script, validated where it enters."""

    model_config = ConfigDict(extra="forbid")
    os: str
    os_name: str | None
    arch: str
    user: str
    uid: int
    python: str
    python_version: list[int] = Field(min_length=3, max_length=3)
    has_venv: bool
    gpus: list[RemoteGpu]
    driver: str | None
    nvidia_error: str | None
    disk_free_bytes: int
    time: float
    port_free: bool
    systemd: bool
    sudo: bool
    agent_running: bool
    unit_active: bool
    layout: Layout
    venv_key: str | None
    wheelhouse_ready: bool
    lab_sha256: str | None

    @property
    def mode(self) -> str:
        """How the agent runs there: a system unit (root or sudo), a user unit, or a detached process (no systemd)."""
        if not self.systemd:
            return "detached"
        return "system" if self.sudo else "user"


def q(path: str) -> str:
    return shlex.quote(path)


def agent_bin(layout: Layout) -> str:
    return q(layout.venv + "/bin/cetlab-agent")


def install_venv(layout: Layout, python: str, key: str, requirement: str) -> str:
    """A new venv beside any old one, installed from the copied wheelhouse alone (no index), then made the current one."""
    venv = f"{layout.venvs}/{key}"
    return (
        f"rm -rf {q(venv)} && {q(python)} -m venv {q(venv)} && "
        f"PIP_CONFIG_FILE=/dev/null {q(venv)}/bin/pip install --quiet --disable-pip-version-check --no-index "
        f"--find-links {q(layout.wheelhouse + '/' + key)} {q(requirement)} && "
        f"echo {q(key)} > {q(venv)}/.cetlab-key && ln -sfn {q(venv)} {q(layout.venv)}"
    )


def receive_wheelhouse(layout: Layout, key: str) -> str:
    target = f"{layout.wheelhouse}/{key}"
    return f"rm -rf {q(target)} && mkdir -p {q(target)} && tar -C {q(target)} -xf - && touch {q(target)}/.complete"


def receive_file(path: str) -> str:
    folder = path.rsplit("/", 1)[0]
    return f"mkdir -p {q(folder)} && cat > {q(path)}.tmp && mv {q(path)}.tmp {q(path)}"


def keys(layout: Layout, name: str, role: str) -> str:
    """The agent's host key (made if missing, printed), then the console's key (on stdin) authorized with its role."""
    common = f"--machine {q(name)} --state-dir {q(layout.state)}"
    return (
        f"mkdir -p {q(layout.state)} && {agent_bin(layout)} host-key {common} && "
        f"{agent_bin(layout)} authorize {common} --role {q(role)} -"
    )


def _detached_launcher(layout: Layout, name: str) -> str:
    """Started in its own session with every stream on the log, so ssh returns and a hangup does not reach it. One line,
    its strings in double quotes (JSON's are Python's): a dry run prints it as it is typed, one layer of quotes."""
    argv = agent_argv([layout.venv + "/bin/cetlab-agent"], layout.lab, name, layout.state)
    log, pid, cwd = (json.dumps(x) for x in (layout.state + "/agent.log", layout.state + "/agent.pid", layout.state))
    return (
        f'import subprocess; log = open({log}, "ab"); '
        f"p = subprocess.Popen({json.dumps(argv)}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, "
        f'start_new_session=True, cwd={cwd}); open({pid}, "w").write(str(p.pid))'
    )


def _sudo(pre: Preflight) -> str:
    return "" if pre.uid == 0 else "sudo -n "


def start_agent(pre: Preflight, name: str) -> list[str]:
    """The commands that install and start the agent as a service (or detached, where systemd is not running)."""
    lay = pre.layout
    common = f"--lab {q(lay.lab)} --machine {q(name)} --state-dir {q(lay.state)}"
    if pre.mode == "system":
        return [
            f"{_sudo(pre)}{agent_bin(lay)} install-unit {common} --run-as {q(pre.user)}",
            f"systemd-analyze verify /etc/systemd/system/{UNIT}",
            f"{_sudo(pre)}systemctl daemon-reload && {_sudo(pre)}systemctl enable --now {UNIT}",
        ]
    if pre.mode == "user":
        return [
            f"{agent_bin(lay)} install-unit --user {common}",
            f"systemd-analyze --user verify ~/.config/systemd/user/{UNIT}",
            f"systemctl --user daemon-reload && systemctl --user enable --now {UNIT}",
            "loginctl enable-linger 2>/dev/null || echo 'could not enable lingering: the agent stops at logout "
            "until root runs: loginctl enable-linger $USER'",
        ]
    return [f"mkdir -p {q(lay.state)} && {q(lay.venv + '/bin/python')} -c {q(_detached_launcher(lay, name))}"]


def stop_agent(pre_mode: str, uid: int, layout: Layout, *, remove_unit: bool) -> str:
    """Stop the service (and, removing, disable it and delete its unit), or end the detached agent by its pid file."""
    if pre_mode in ("system", "user"):
        ctl = "systemctl --user" if pre_mode == "user" else ("" if uid == 0 else "sudo -n ") + "systemctl"
        if not remove_unit:
            return f"{ctl} stop {UNIT}"
        unit = f"~/.config/systemd/user/{UNIT}" if pre_mode == "user" else f"/etc/systemd/system/{UNIT}"
        rm = "rm -f" if pre_mode == "user" or uid == 0 else "sudo -n rm -f"
        return f"{ctl} disable --now {UNIT}; {rm} {unit} && {ctl} daemon-reload"
    pidfile = q(layout.state + "/agent.pid")
    return (
        f"pid=$(cat {pidfile} 2>/dev/null); "
        f'if [ -n "$pid" ] && grep -q cetlab-agent /proc/$pid/cmdline 2>/dev/null; then kill "$pid"; i=0; '
        # until it is gone (an exited one not yet reaped has no cmdline): the agent's own stop takes at most 25 s
        f"while grep -q cetlab-agent /proc/$pid/cmdline 2>/dev/null && [ $i -lt 400 ]; do sleep 0.1; i=$((i+1)); done; "
        f"fi; rm -f {pidfile}"
    )


def restart_agent(pre: Preflight, name: str) -> list[str]:
    if pre.mode == "detached":
        return [stop_agent("detached", pre.uid, pre.layout, remove_unit=False), *start_agent(pre, name)]
    ctl = "systemctl --user" if pre.mode == "user" else f"{_sudo(pre)}systemctl"
    return [f"{ctl} restart {UNIT}"]


def purge(layout: Layout, uid: int) -> str:
    """--purge: the agent's state (runs, checkpoints, keys), every venv, the wheelhouses and the lab.yaml copy."""
    sudo = "" if uid == 0 or layout.state.startswith(layout.home) else "sudo -n "
    # then the folders that held them, where nothing else is left in them (rmdir takes only an empty one): the
    # state's cetlab folder (~/.local/state/cetlab, /var/lib/cetlab) and the cache's (~/.cache/cetlab)
    parents = " ".join(q(path.rsplit("/", 1)[0]) for path in (layout.state, layout.wheelhouse))
    return (
        f"{sudo}rm -rf {q(layout.state)} && rm -rf {q(layout.base)} {q(layout.wheelhouse)} && "
        f"{{ {sudo}rmdir {parents} 2>/dev/null || true; }}"
    )


# What to install next for the machine's GPUs: run there with its new venv, so the rule stays in agents/gpusupport/
ADVICE = r"""
import json, sys
from agents.gpusupport.matrix import LLAMACPP_ARCHS, torch_fix
from agents.wire.capability import capability_by_name, parse_capability

gpus = json.loads(sys.argv[1])
archs = []
for gpu in gpus:
    cc = parse_capability(gpu["compute_capability"]) if gpu["compute_capability"] else capability_by_name(gpu["name"])
    if cc is None:
        print(f"GPU {gpu['index']} {gpu['name']}: compute capability unknown; see docs/engines.md, Older GPUs")
        continue
    archs.append(str(cc.number))
    print(f"GPU {gpu['index']} {gpu['name']} ({cc}): torch for training and vLLM: {torch_fix(cc, sys.argv[2])}")
if archs:
    wanted = ";".join(sorted(set(archs)))
    print(f"llama-server for these GPUs (CUDA 12.x, nvcc): make llama-server LLAMA_CUDA_ARCHS=\"{wanted}\" "
          f"(the lab's usual set is {LLAMACPP_ARCHS})")
"""


def advice(layout: Layout, gpus: list[RemoteGpu]) -> str:
    payload = "[" + ",".join(g.model_dump_json() for g in gpus) + "]"
    return f"{q(layout.venv + '/bin/python')} - {q(payload)} {q(layout.venv + '/bin/python')}"
