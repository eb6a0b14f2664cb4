"""The demo lab's builder: DIR/lab.yaml, keys and known hosts for loopback, and one real agent process per machine."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from agents.runtime.demo import DEMO_DIR_NAME, LAB_FILE, LOCK_NAME, demo_cli_line, shown_path
from agents.runtime.keys import AUTHORIZED_KEYS_NAME, HOST_KEY_NAME, ensure_key, open_private_log, write_private
from agents.runtime.labfile import PUSHED_NAME
from agents.runtime.peers import NODE_KEY_NAME, PEER_KNOWN_HOSTS_NAME, SCHEDULER_KEY_NAME
from agents.runtime.ports import server_port
from agents.shell.demo import gateway as gateway_demo
from agents.shell.demo import notify as notify_demo
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.model import load_lab, parse_lab
from agents.wire.lab.queue import queues_jobs, scheduler_machine
from agents.wire.lab.spread import node_links

REPO_ROOT = Path(__file__).resolve().parents[3]

# GPUs of the emulated machines of `--scale N`: 8 each, mixed like a real second-hand lab.
SCALE_GPUS = [
    {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250, "profile": "training"},
    {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250, "profile": "training"},
    {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250, "profile": "serving"},
    {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250, "profile": "serving"},
    {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250, "profile": "bursty"},
    {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250, "profile": "bursty"},
    {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75, "profile": "serving"},
    {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75, "profile": "idle"},
]


def checkout_lab() -> Path:
    """The checkout's lab.yaml: the demo's source when none is given (the console passes the one it ships)."""
    return REPO_ROOT / LAB_FILE


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now, each claimed (agents.runtime.ports): never one the kernel gives an outgoing
    connection, since a demo agent listens on its port again after a restart (an agent's restart failed with "address
    already in use" under a loaded suite when they were picked by bind(0)), nor one another demo just chose."""
    chosen: list[int] = []
    for _ in range(count):
        chosen.append(server_port("127.0.0.1", avoid=frozenset(chosen)))
    return chosen


def _scaled(data: dict[str, Any], scale: int) -> dict[str, Any]:
    machines = [
        {"name": f"node{i:03d}", "role": "emulated", "idle_watts": 200, "gpus": {"seed": i, "sim": [dict(g) for g in SCALE_GPUS]}}
        for i in range(scale)
    ]
    # only the lab-wide sections: models, trainers and the like name the demo lab's machines
    kept: dict[str, Any] = {key: data[key] for key in ("costs", "cloud_prices", "alerts") if key in data}
    return {**kept, "lab": f"{data.get('lab', 'lab')}-x{scale}", "machines": machines}


def in_demo_dir(path: str) -> str:
    """A path of the checkout's lab.yaml as the demo's own lab file (in the demo's folder) means it: the checkout names
    the demo's folder `.cetlab-demo/...`, and a lab's paths are relative to its lab file, so written into that folder
    they would be `.cetlab-demo/.cetlab-demo/...`."""
    head, sep, rest = path.partition("/")
    return rest if sep and head == DEMO_DIR_NAME and rest else path


def relocate_paths(data: dict[str, Any]) -> None:
    """The lab's paths into the demo's folder (in_demo_dir): models, trainers' output dirs, watched checkpoint dirs."""
    for model in data.get("models") or []:
        if isinstance(model.get("path"), str):
            model["path"] = in_demo_dir(model["path"])
    for trainer in data.get("trainers") or []:
        if isinstance(trainer.get("output_dir"), str):
            trainer["output_dir"] = in_demo_dir(trainer["output_dir"])
    for watched in (data.get("checkpoints") or {}).get("dirs") or []:
        if isinstance(watched.get("path"), str):
            watched["path"] = in_demo_dir(watched["path"])


def migrate_nested(directory: Path) -> None:
    """Demo state of older versions, kept in DIR/.cetlab-demo/ (runs, models, the tiny model, hand-run output), moves
    up into DIR; a link is left where each was, since job records and adapters' configs name the old paths."""
    nested = directory / DEMO_DIR_NAME
    if not nested.is_dir() or nested.is_symlink():
        return
    for entry in sorted(nested.iterdir()):
        target = directory / entry.name
        if entry.is_symlink() or target.exists() or target.is_symlink():
            continue  # moved already, or a name the demo's folder has itself: left where it is
        entry.rename(target)
        entry.symlink_to(Path("..") / entry.name)


def copy_assets(assets: Path, directory: Path) -> None:
    """The recipe files beside the lab (demo/): their paths name the demo's folder as seen from the checkout
    (`../.cetlab-demo/...`); copied into that folder, the same place is `../...`."""
    target = directory / "demo"
    shutil.copytree(assets, target, dirs_exist_ok=True)
    for config in target.glob("*.yaml"):
        text = config.read_text()
        moved = text.replace(f"../{DEMO_DIR_NAME}/", "../")
        if moved != text:
            config.write_text(moved)


class DemoRunningError(RuntimeError):
    """Another process runs a demo lab from the same folder."""


def _node_links(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(caller, callee) of the node role, as agents.wire.lab.spread.node_links says of the validated lab."""
    return node_links(parse_lab(yaml.safe_dump(data)))


def coordinators(data: dict[str, Any]) -> list[str]:
    """The machines that call others with the node role (a multi-node recipe's first node, a spread model's machine)."""
    return sorted({caller for caller, _ in _node_links(data)})


def node_key_lines(directory: Path, data: dict[str, Any]) -> dict[str, str]:
    """Per machine, the authorized_keys lines giving each agent that calls it with the node role that role."""
    lines: dict[str, str] = {}
    for caller, callee in _node_links(data):
        key = ensure_key(directory / "agents" / caller / NODE_KEY_NAME, comment=f"cetlab-node@{caller}")
        kind, blob = key.export_public_key().decode().split()[:2]
        line = f"node {kind} {blob} node@{caller}\n"
        if line not in lines.get(callee, ""):
            lines[callee] = lines.get(callee, "") + line
    return lines


def scheduler_key_line(directory: Path, machine: str) -> str:
    """The authorized_keys line giving the lab queue's agent (on ``machine``) the scheduler role on the others."""
    key = ensure_key(directory / "agents" / machine / SCHEDULER_KEY_NAME, comment=f"cetlab-scheduler@{machine}")
    kind, blob = key.export_public_key().decode().split()[:2]
    return f"scheduler {kind} {blob} scheduler@{machine}\n"


class DemoLab:
    """Writes DIR/lab.yaml (client side complete) and runs one agent per machine.

    DIR is kept: a second start on it reuses its keys, agent state, runs and checkpoints,
    with fresh ports (written into DIR/lab.yaml and its known_hosts). One demo per DIR at a time.
    """

    def __init__(
        self,
        directory: Path,
        source: Path | None = None,
        scale: int | None = None,
        agents_per_process: int = 1,
        keep_engines: bool = False,
    ):
        self.dir = directory.resolve()
        self.keep_engines = keep_engines  # the agents run with --keep-engines: a restarted one re-adopts its engines
        self.source = source or checkout_lab()
        self.scale = scale
        self.agents_per_process = agents_per_process
        self.lab_path = self.dir / LAB_FILE
        self.processes: list[subprocess.Popen[bytes]] = []
        self._agent_at: dict[str, int] = {}  # machine -> its agent's index in processes
        self._lock_fd: int | None = None

    def prepare(self) -> Path:
        source_lab = load_lab(self.source)  # a broken source lab fails here, with file and line
        data = yaml.safe_load(self.source.read_text())
        if self.scale:
            data = _scaled(data, self.scale)
        relocate_paths(data)
        self.dir.mkdir(parents=True, exist_ok=True)
        migrate_nested(self.dir)
        assets = self.source.parent / "demo"
        if assets.is_dir():  # refreshed on every start: the checkout's recipe files may have changed
            copy_assets(assets, self.dir)
        console_dir = self.dir / "console"
        client_key = ensure_key(console_dir / "id_ed25519", comment="cetlab-demo-console")
        client_pub = client_key.export_public_key().decode().split()
        ports = free_ports(len(data["machines"]))
        gateway_line = gateway_demo.peer_key_line(self.dir, data)  # the gateway's agent calls the others with the gateway role
        node_lines = node_key_lines(
            self.dir, data
        )  # the first node's agent of a multi-node recipe calls the others with the node role
        # the lab queue's agent starts jobs on the others with the scheduler role
        queue = scheduler_machine(source_lab) if queues_jobs(source_lab) and len(data["machines"]) > 1 else None
        queue_line = scheduler_key_line(self.dir, queue) if queue is not None else ""
        known_hosts = []
        for machine, port in zip(data["machines"], ports):
            machine.update(host="127.0.0.1", port=port, via="agent")
            state = self.dir / "agents" / machine["name"]
            # a lab.yaml pushed to the last run's agents names its ports: this run's lab.yaml (fresh ports) wins
            (state / PUSHED_NAME).unlink(missing_ok=True)
            host_key = ensure_key(state / HOST_KEY_NAME, comment=f"cetlab-agent@{machine['name']}")
            authorized = (
                f"operator {client_pub[0]} {client_pub[1]} demo-console\n"
                + gateway_line
                + node_lines.get(machine["name"], "")
                + (queue_line if machine["name"] != queue else "")
            )
            write_private(state / AUTHORIZED_KEYS_NAME, authorized.encode())
            known_hosts.append(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}")
        (console_dir / "known_hosts").write_text("\n".join(known_hosts) + "\n")
        gateway_demo.prepare(self.dir, data, "\n".join(known_hosts) + "\n", free_ports)
        notify_demo.prepare(self.dir, data, free_ports)
        for coordinator in [*coordinators(data), *([queue] if queue is not None else [])]:
            write_private(self.dir / "agents" / coordinator / PEER_KNOWN_HOSTS_NAME, ("\n".join(known_hosts) + "\n").encode())
        data["console"] = {**(data.get("console") or {}), "key": "console/id_ed25519", "known_hosts": "console/known_hosts"}
        header = "# Written by `cetlab demo`: the demo lab on loopback, with this run's ports and keys.\n"
        self.lab_path.write_text(header + yaml.safe_dump(data, sort_keys=False))
        load_lab(self.lab_path)
        return self.lab_path

    def machine_names(self) -> list[str]:
        return [m["name"] for m in yaml.safe_load(self.lab_path.read_text())["machines"]]

    def start(self) -> None:
        self.lock()
        self.prepare()
        self.launch()

    def lock(self) -> None:
        """Hold DIR for this process: a second demo on it would rewrite the ports under the first one's agents."""
        if self._lock_fd is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise DemoRunningError(
                f"a demo lab is already running from {shown_path(self.dir)} (pid {other or '?'}); "
                f"use it: {demo_cli_line(self.dir)}"
            ) from None
        os.ftruncate(fd, 0)  # a pid left by a demo that died is rewritten, never trusted
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def launch(self) -> None:
        """Start the agent processes of an already prepared demo dir (again, after a stop)."""
        names = self.machine_names()
        data = yaml.safe_load(self.lab_path.read_text())
        for argv in gateway_demo.stand_in_argvs(self.dir, data) + notify_demo.receiver_argvs(self.dir, data):
            log = open_private_log(self.dir / "agents" / "provider-stand-in.log")
            self.processes.append(
                subprocess.Popen(
                    [*argv, "--parent-pid", str(os.getpid())],
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            log.close()
        step = max(1, self.agents_per_process)
        for i in range(0, len(names), step):
            group = names[i : i + step]
            state_dir = self.dir / "agents" / group[0] if len(group) == 1 else self.dir / "agents"
            argv = agent_argv(
                python_agent(sys.executable),
                self.lab_path,
                group,
                state_dir,
                log_level="warning",
                keep_engines=self.keep_engines,
                parent_pid=os.getpid(),
            )
            log = open_private_log(self.dir / "agents" / f"{group[0]}.log")
            self._agent_at.update(dict.fromkeys(group, len(self.processes)))
            self.processes.append(
                subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            )
            log.close()

    def agent_process(self, machine: str) -> subprocess.Popen[bytes]:
        """The process of the agent that serves ``machine`` (tests kill and restart it)."""
        return self.processes[self._agent_at[machine]]

    def replace_agent(self, machine: str, process: subprocess.Popen[bytes]) -> None:
        """A restarted agent of ``machine``: stopped with the others at the end."""
        self.processes[self._agent_at[machine]] = process

    def wait_listening(self, timeout: float = 30.0) -> None:
        """Block until every agent accepts TCP connections (or one of them died)."""
        data = yaml.safe_load(self.lab_path.read_text())
        deadline = time.monotonic() + timeout
        pending = {(m["host"], m["port"]) for m in data["machines"]}
        while pending and time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"a demo agent exited with code {proc.returncode}; see {self.dir / 'agents'}/*.log")
            for addr in list(pending):
                try:
                    socket.create_connection(addr, timeout=0.2).close()
                    pending.discard(addr)
                except OSError:
                    pass
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"demo agents not listening after {timeout:.0f} s: {sorted(pending)}")

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()
        self._agent_at.clear()
        self.unlock()

    def __enter__(self) -> DemoLab:
        self.start()
        self.wait_listening()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
