"""`cetlab machine add` and `cetlab machine remove`, step by step.

Each step first looks at what is there (the pre-flight's answer, the workstation's files) and says "already ..." when
its work is done, so a run after a failure continues where it stopped; with --dry-run every command that would change
something is printed instead of run (the read-only pre-flight still runs, so the plan is the real one).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from agents.runtime.keys import ensure_key
from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.protocol import RemoteError
from agents.wire.words import plural
from console.machine import remote
from console.machine.files import (
    Record,
    add_machine,
    entry_conflict,
    load_record,
    pin_host_key,
    read_doc,
    records_dir,
    remove_machine,
    save_record,
    unpin_host_key,
)
from console.machine.remote import MIN_FREE_BYTES, MIN_PYTHON, Preflight
from console.machine.ssh import MachineError, Ssh, Target, build_wheelhouse, package_version, wheelhouse_key

OK, WARN, FAIL = "ok", "warn", "FAIL"
SKEW_WARN_S, SKEW_FAIL_S = 2.0, 60.0


@dataclass
class StepTime:
    name: str
    seconds: float
    said: str = ""


@dataclass
class Progress:
    """Prints each step as it ends, with its time; `steps` is what --json reports."""

    say: Callable[[str], None]
    steps: list[StepTime] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[StepTime]:
        started = time.monotonic()
        record = StepTime(name, 0.0)
        self.say(f"- {name}")
        yield record
        record.seconds = time.monotonic() - started
        self.steps.append(record)
        self.say(f"  {record.said or 'done'} ({record.seconds:.1f} s)")


@dataclass
class AddOptions:
    lab_path: Path
    name: str
    target: Target
    agent_port: int | None = None
    role: str = "operator"
    gpus: str | None = None
    ssh_config: Path | None = None
    dry_run: bool = False
    timeout_s: float = 60.0
    lab_name: str = "lab"


def tense(dry_run: bool, done: str, would: str) -> str:
    """A step's words: what it did, or in a dry run what it would do (it did nothing)."""
    return would if dry_run else done


def ssh_for(target: Target, ssh_config: Path | None, dry_run: bool, say: Callable[[str], None]) -> Ssh:
    return Ssh(target, ssh_config, dry_run, say)


def preflight(ssh: Ssh, name: str, port: int, key: str) -> tuple[Preflight, float]:
    """The machine's answer and its clock's offset from the workstation's (seconds, + ahead)."""
    args = json.dumps({"name": name, "port": port, "key": key})
    before = time.time()
    ran = ssh.run(f"{remote.FIND_PYTHON} {remote.q(args)}", stdin=remote.PREFLIGHT.encode(), changes=False, check=False)
    after = time.time()
    if ran.code == 127 and "python3" in ran.err:
        raise MachineError(f"{ssh.target}: no python3 on PATH\n  fix: install Python 3.11 or newer with its venv module there")
    if ran.code != 0:
        ssh.run("true", changes=False)  # says whether ssh itself failed, with its fix
        raise MachineError(f"the pre-flight failed on {ssh.target} (exit {ran.code}): {ran.err.strip()[-1500:]}")
    try:
        answer = Preflight.model_validate_json(ran.out.strip().splitlines()[-1] if ran.out.strip() else "")
    except ValidationError as exc:
        raise MachineError(f"the pre-flight on {ssh.target} answered what it should not: {exc}") from None
    return answer, answer.time - (before + after) / 2


def judge(pre: Preflight, port: int, skew_s: float) -> list[tuple[str, str, str]]:
    """(level, what, words with the fix) for each pre-flight check; any FAIL stops `machine add` before a change."""
    here = tuple(sys.version_info[:2])
    there = tuple(pre.python_version[:2])
    version = ".".join(map(str, pre.python_version))
    checks = [(OK if pre.os == "Linux" else WARN, "os", f"{pre.os_name or pre.os} ({pre.arch})")]
    if there < MIN_PYTHON:
        checks.append(
            (FAIL, "python", f"{pre.python} is {version}; fix: install Python 3.11 or newer (python3.11 and python3.11-venv)")
        )
    elif there != here:
        checks.append(
            (FAIL, "python", f"{pre.python} is {version}, and this workstation builds wheels for {here[0]}.{here[1]}; fix: "
             f"install python{here[0]}.{here[1]} on the machine, or run machine add from a {there[0]}.{there[1]} workstation")
        )  # fmt: skip
    elif not pre.has_venv:
        checks.append((FAIL, "python", f"{pre.python} ({version}) has no venv module; fix: apt-get install python3-venv"))
    else:
        checks.append((OK, "python", f"{pre.python} ({version})"))
    if pre.gpus:
        for gpu in pre.gpus:
            cc = gpu.compute_capability or "capability not reported"
            checks.append((OK, f"gpu{gpu.index}", f"{gpu.name} ({cc}), driver {pre.driver}"))
    else:
        checks.append(
            (WARN, "gpus", f"none found ({pre.nvidia_error}); the machine joins with gpus: none. With GPUs, install the "
             "NVIDIA driver (nvidia-smi must work) and run machine add again with --gpus nvml")
        )  # fmt: skip
    free = pre.disk_free_bytes
    checks.append(
        (OK if free >= MIN_FREE_BYTES else FAIL, "disk", f"{free / 1024**3:.1f} GiB free in {pre.layout.home}"
         + ("" if free >= MIN_FREE_BYTES else "; fix: free at least 2 GiB there"))
    )  # fmt: skip
    level = OK if abs(skew_s) < SKEW_WARN_S else WARN if abs(skew_s) < SKEW_FAIL_S else FAIL
    fix = "" if level == OK else "; fix: enable time sync there (timedatectl set-ntp true, or chrony)"
    checks.append((level, "clock", f"{skew_s:+.1f} s against this workstation{fix}"))
    if pre.port_free:
        checks.append((OK, "port", f"{port} free for the agent"))
    elif pre.agent_running:
        checks.append((OK, "port", f"{port}: the cetlab agent listens there already"))
    else:
        checks.append((FAIL, "port", f"{port} is taken on the machine; fix: pass --agent-port with a free port"))
    service = {
        "system": (OK, "a systemd system unit"),
        "user": (WARN, "a systemd user unit (no root or sudo -n): it needs lingering to run after logout"),
        "detached": (WARN, "no systemd running (a container?): the agent runs detached and will not survive a reboot"),
    }[pre.mode]
    checks.append((service[0], "service", service[1]))
    return checks


def console_paths(lab_path: Path) -> tuple[Path, Path, Lab | None]:
    """The console's key and known_hosts as lab.yaml's console section names them (defaults where it does not load)."""
    from console.lab.client import default_key_path, default_known_hosts

    try:
        lab: Lab | None = load_lab(lab_path) if lab_path.exists() else None
    except LabError:
        lab = None
    if lab is None:
        return default_key_path(), default_known_hosts(), None
    return (
        lab.resolve(lab.console.key) or default_key_path(),
        lab.resolve(lab.console.known_hosts) or default_known_hosts(),
        lab,
    )


async def push_everywhere(lab_path: Path, timeout_s: float, say: Callable[[str], None]) -> str:
    """The workstation's lab.yaml pushed to every machine in it, as `cetlab lab push` does (validated there, applied
    live, the peer trust it carries written: pinned host keys, the gateway's and coordinators' keys authorized); what
    happened, in a few words. A machine that did not take it is said, with the command to run once it is back."""
    from console.lab.client import FleetClient
    from console.lab.push import push_lab, said_line

    lab = load_lab(lab_path)
    client = FleetClient(lab, subscribe=[], reconnect=False)
    async with client:
        await client.wait_connected(timeout_s)
        replies, missing = await push_lab(lab, client, dry_run=False)
    for name, reply in replies.items():
        say("  " + said_line(name, reply).replace("\n", "\n  "))
    failed = [name for name, reply in replies.items() if isinstance(reply, RemoteError)]
    if failed or missing:
        say(f"  then: cetlab lab push (once {', '.join(failed + missing)} answers)")
        return f"pushed to {len(replies) - len(failed)} of {plural(len(replies), 'machine')}"
    return f"pushed to {plural(len(replies), 'machine')}, applied live"


async def wait_online(
    lab_path: Path, name: str, timeout_s: float, started_after: float | None = None, version: str | None = None
) -> str:
    """Dial the new agent as the console does (the pinned host key, the console's key) until it answers (an agent
    started after `started_after`, of `version`, where given); its line."""
    from console.lab.client import FleetClient
    from console.lab.status import status_human, status_json

    lab = load_lab(lab_path)
    one = lab.model_copy(update={"machines": [lab.machine(name)]})
    deadline = time.monotonic() + timeout_s
    while True:
        client = FleetClient(one, subscribe=[], reconnect=False)
        async with client:
            await client.wait_connected(max(1.0, min(5.0, deadline - time.monotonic())))
            view = client.state.machines[name]
            hello = view.hello if view.online else None
            if hello is not None and (started_after is None or hello.started_at > started_after):
                if version is None or hello.agent_version == version:
                    data = {**status_json(client.state), "gateway": None, "models": None}  # the machine's lines only
                    return status_human(data).split("\n", 1)[1]
                last = f"it answers as cetlab {hello.agent_version}, not {version}"
            else:
                last = view.error or view.link if hello is None else "the agent that answers started before the switch"
        if time.monotonic() > deadline:
            raise MachineError(f"{name} did not come online within {timeout_s:.0f} s: {last}")
        await asyncio.sleep(0.5)  # a retry's pace, not a synchronisation: the condition is the agent answering


async def add(o: AddOptions, say: Callable[[str], None]) -> list[StepTime]:
    """Over 80 lines: machine add's steps read top to bottom in the order they run, one `progress.step` each."""
    progress = Progress(say)
    ssh = ssh_for(o.target, o.ssh_config, o.dry_run, say)
    doc = read_doc(o.lab_path, o.lab_name)
    lab_name = str(doc.get("lab") or o.lab_name)
    existing = next((m for m in doc.get("machines") or [] if isinstance(m, dict) and m.get("name") == o.name), None)
    port = o.agent_port or (int(existing.get("port", 7022)) if existing is not None else 7022)
    key = wheelhouse_key()
    folder = records_dir(lab_name)
    if o.dry_run:
        say(ssh.would())

    with progress.step(f"pre-flight on {o.target}") as step:
        pre, skew = preflight(ssh, o.name, port, key)
        checks = judge(pre, port, skew)
        for level, what, words in checks:
            say(f"  {level:<4} {what:<8} {words}")
        if any(level == FAIL for level, _, _ in checks):
            raise MachineError(f"the pre-flight of {o.name} failed (see FAIL above); nothing was changed")
        host = ssh.resolved_host()
        conflict = entry_conflict(o.lab_path, doc, o.name, host, port)
        if conflict is not None:
            raise MachineError(conflict + "\n  nothing was changed")
        step.said = f"{pre.layout.venv} on {host}, the agent on port {port} ({pre.mode})"
    lay = pre.layout
    before = load_record(folder, o.name)
    record = Record(
        machine=o.name, target=str(o.target), ssh_config=str(o.ssh_config) if o.ssh_config else None,
        host=host, port=port, mode=pre.mode, uid=pre.uid, layout=lay,
        started_lab_sha256=before.started_lab_sha256 if before is not None else pre.lab_sha256,
    )  # fmt: skip
    if not o.dry_run:
        save_record(folder, record)  # from here `machine remove` can undo a half-done add

    with progress.step("wheelhouse (this package and its dependencies)") as step:
        from platformdirs import user_cache_path

        wheels, built = build_wheelhouse(user_cache_path("cetlab") / "wheelhouse", key, o.dry_run, say)
        step.said = f"{tense(o.dry_run, 'built', 'would build') if built else 'already built'}: {wheels}"
    with progress.step("the wheelhouse on the machine") as step:
        if pre.wheelhouse_ready:
            step.said = f"already there: {lay.wheelhouse}/{key}"
        else:
            ssh.send_tree(wheels, remote.receive_wheelhouse(lay, key))
            step.said = f"{tense(o.dry_run, 'copied', 'would copy it')} to {lay.wheelhouse}/{key}"
    with progress.step("the agent's venv (no package index used)") as step:
        venv_changed = pre.venv_key != key
        if not venv_changed:
            step.said = f"already installed: {lay.venv}"
        else:
            ssh.run(remote.install_venv(lay, pre.python, key, f"cetlab=={package_version()}"))
            step.said = (
                f"{tense(o.dry_run, 'installed', 'would install')} cetlab {package_version()} in {lay.venvs}/{key}, "
                f"{tense(o.dry_run, 'linked', 'link it')} as {lay.venv}"
            )
    with progress.step("next: the GPU stack (not installed by machine add)") as step:
        if not pre.gpus:
            say("  no GPU: models run on llama-server's CPU build (make llama-server), training on torch's CPU build")
            step.said = "nothing to install for GPUs"
        else:
            ran = ssh.run(remote.advice(lay, pre.gpus), stdin=remote.ADVICE.encode(), changes=False, check=False)
            missing = (
                "(the advice needs cetlab's venv there, which a dry run does not install)"
                if o.dry_run
                else "(the advice needs the venv: run machine add again)"
            )
            for line in (ran.out.strip() or missing).splitlines():
                say(f"  {line}")
            step.said = "printed"

    key_path, known_hosts, _lab = console_paths(o.lab_path)
    with progress.step("keys: pin the agent's host key, authorize the console's key") as step:
        console_key = ensure_key(key_path, comment=f"cetlab-console@{socket.gethostname()}") if not o.dry_run else None
        public = console_key.export_public_key().decode() if console_key is not None else ""
        ran = ssh.run(remote.keys(lay, o.name, o.role), stdin=public.encode(), stdin_from=f"{key_path}.pub")
        if o.dry_run:
            step.said = f"would pin the host key in {known_hosts} and authorize {key_path} as {o.role}"
        else:
            pinned = pin_host_key(known_hosts, host, port, ran.out.splitlines()[0] if ran.out else "", o.dry_run)
            step.said = f"host key {pinned} in {known_hosts}; {key_path}.pub authorized as {o.role}"

    with progress.step("lab.yaml") as step:
        gpus = o.gpus or ("nvml" if pre.gpus else "none")
        if o.dry_run:
            step.said = f"would add {o.name} ({host}:{port}, gpus: {gpus}) to {o.lab_path} and copy it to the machine"
        else:
            added = add_machine(o.lab_path, lab_name, o.name, host, port, gpus, f"{o.target}")
            text = o.lab_path.read_bytes()
            lab_sha = hashlib.sha256(text).hexdigest()
            copied = lab_sha != pre.lab_sha256
            if copied:
                ssh.run(remote.receive_file(lay.lab), stdin=text)
            step.said = (
                ("added to " if added else "already in ")
                + str(o.lab_path)
                + (f"; copied to {lay.lab}" if copied else "; the machine's copy is the same")
            )

    with progress.step("the agent as a service") as step:
        if pre.agent_running and venv_changed:
            for command in remote.restart_agent(pre, o.name):
                ssh.run(command)
            step.said = tense(o.dry_run, "restarted to run the new venv", "would restart it to run the new venv")
        elif pre.agent_running:
            step.said = "already running (a changed lab.yaml is pushed to it live below)"
        else:
            for command in remote.start_agent(pre, o.name):
                ssh.run(command)
            step.said = {
                "system": tense(o.dry_run, "systemd unit enabled and started", "would enable and start a systemd unit"),
                "user": tense(o.dry_run, "systemd user unit enabled and started", "would enable and start a systemd user unit"),
                "detached": tense(o.dry_run, "started detached", "would start it detached")
                + f" (log: {lay.state}/agent.log); it will not survive a reboot",
            }[pre.mode]
        if not o.dry_run:
            record.started_lab_sha256 = hashlib.sha256(o.lab_path.read_bytes()).hexdigest()
            save_record(folder, record)
    if o.dry_run:
        say(f"- lab.yaml to every machine (lab push)\n  would push {o.lab_path} (cetlab lab push): the peers learn {o.name}")
        return progress.steps
    with progress.step("online") as step:
        line = await wait_online(o.lab_path, o.name, o.timeout_s)
        say(line)
        step.said = f"{o.name} answers the console"
    with progress.step("lab.yaml pushed to every machine (lab push)") as step:
        # the new agent started from the copy above; the push gives every agent this lab.yaml live and the peer
        # trust it needs (the gateway's machine its peers' host keys, and its key authorized on them)
        step.said = await push_everywhere(o.lab_path, o.timeout_s, say)
    return progress.steps


async def remove(lab_path: Path, name: str, purge: bool, dry_run: bool, say: Callable[[str], None]) -> list[StepTime]:
    progress = Progress(say)
    doc = read_doc(lab_path, "lab")
    folder = records_dir(str(doc.get("lab") or "lab"))
    record = load_record(folder, name)
    with progress.step("lab.yaml can lose it") as step:
        in_lab = remove_machine(lab_path, name, dry_run=True)  # raises, before anything changes, if it cannot
        if record is None and not in_lab:
            raise MachineError(f"no machine {name!r} in {lab_path} nor added from this workstation")
        step.said = "yes" if in_lab else "it is not in lab.yaml"
    if record is not None:
        ssh = Ssh(Target.parse(record.target), Path(record.ssh_config) if record.ssh_config else None, dry_run, say)
        if dry_run:
            say(ssh.would())
        with progress.step(f"stop the agent on {record.target}") as step:
            ssh.run(remote.stop_agent(record.mode, record.uid, record.layout, remove_unit=True))
            step.said = (
                tense(dry_run, "unit disabled and removed", "would disable and remove its unit")
                if record.mode != "detached"
                else tense(dry_run, "stopped", "would stop it")
            )
        with progress.step("the machine's files") as step:
            if purge:
                ssh.run(remote.purge(record.layout, record.uid))
                step.said = (
                    f"{tense(dry_run, 'purged', 'would purge')}: "
                    f"{record.layout.state}, {record.layout.base}, {record.layout.wheelhouse}"
                )
            else:
                step.said = f"kept (runs, checkpoints, venv): {record.layout.state}, {record.layout.base}; --purge removes them"
    _key, known_hosts, _lab = console_paths(lab_path)
    with progress.step("known_hosts and lab.yaml") as step:
        entry = next((m for m in doc.get("machines") or [] if isinstance(m, dict) and m.get("name") == name), None)
        host = record.host if record is not None else str(entry.get("host", "127.0.0.1")) if entry is not None else ""
        port = record.port if record is not None else int(entry.get("port", 7022)) if entry is not None else 0
        unpinned = bool(host) and unpin_host_key(known_hosts, host, port, dry_run)
        remove_machine(lab_path, name, dry_run)
        if record is not None and not dry_run:
            (folder / f"{name}.json").unlink(missing_ok=True)
        step.said = (
            tense(dry_run, "host key unpinned; ", "would unpin its host key; ") if unpinned else "no host key pinned; "
        ) + tense(dry_run, f"{name} taken out of {lab_path}", f"would take {name} out of {lab_path}")
    if not dry_run and lab_path.exists() and read_doc(lab_path, "lab").get("machines"):  # none left: nobody to push to
        with progress.step("lab.yaml pushed to the other machines (lab push)") as step:
            step.said = await push_everywhere(lab_path, 30.0, say)  # the gateway drops its link to it, and its trust
    return progress.steps
