"""`cetlab lab upgrade`: this package's build rolled out to the machines `cetlab machine add` set up, one at a time.

Per machine: the wheelhouse copied (if it is not there), a new venv installed beside the one in use, the `venv` link
switched, the agent restarted (its unit, or the detached process), and the console waits for that machine to answer
from a process started after the switch, with this version. One that does not within the wait gets its previous venv
back and is restarted on it, and the roll-out stops there (the machines after it keep what they run). A systemd unit
keeps jobs and engines across the restart (KillMode=process, --keep-engines: the new agent re-adopts them); a
detached agent stops its engines with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from console.machine import remote
from console.machine.files import all_records, read_doc, records_dir
from console.machine.ssh import MachineError, Ssh, Target, build_wheelhouse, package_version, wheelhouse_key
from console.machine.steps import Progress, StepTime, preflight, tense, wait_online


async def upgrade(
    lab_path: Path, only: list[str], dry_run: bool, timeout_s: float, say: Callable[[str], None]
) -> tuple[list[StepTime], list[str]]:
    """(each machine's step, the machines rolled back)."""
    from platformdirs import user_cache_path

    progress = Progress(say)
    doc = read_doc(lab_path, "lab")
    order = [str(m.get("name")) for m in doc.get("machines") or [] if isinstance(m, dict)]
    records = sorted(
        all_records(records_dir(str(doc.get("lab") or "lab"))),
        key=lambda r: order.index(r.machine) if r.machine in order else len(order),
    )
    unknown = [name for name in only if name not in {r.machine for r in records}]
    if unknown:
        raise MachineError(f"not added with `cetlab machine add` from this workstation: {', '.join(unknown)}")
    records = [r for r in records if not only or r.machine in only]
    if not records:
        raise MachineError("no machine to upgrade: none was added with `cetlab machine add` from this workstation")
    key, version = wheelhouse_key(), package_version()
    with progress.step("wheelhouse (this package and its dependencies)") as step:
        wheels, built = build_wheelhouse(user_cache_path("cetlab") / "wheelhouse", key, dry_run, say)
        step.said = f"{tense(dry_run, 'built', 'would build') if built else 'already built'}: {wheels}"
    rolled_back: list[str] = []
    for record in records:
        ssh = Ssh(Target.parse(record.target), Path(record.ssh_config) if record.ssh_config else None, dry_run, say)
        if dry_run:
            say(ssh.would())
        with progress.step(f"{record.machine} to cetlab {version} ({key})") as step:
            pre, _skew = preflight(ssh, record.machine, record.port, key)
            lay = pre.layout
            if pre.venv_key == key and pre.agent_running:
                step.said = "already runs it"
                continue
            previous = ssh.run(f"readlink {remote.q(lay.venv)} || true", changes=False).out.strip()
            if not pre.wheelhouse_ready:
                ssh.send_tree(wheels, remote.receive_wheelhouse(lay, key))
            ssh.run(remote.install_venv(lay, pre.python, key, f"cetlab=={version}"))
            switched = time.time()
            for command in (
                remote.restart_agent(pre, record.machine) if pre.agent_running else remote.start_agent(pre, record.machine)
            ):
                ssh.run(command)
            if dry_run:
                step.said = f"would run cetlab {version} from {lay.venvs}/{key}"
                continue
            try:
                await wait_online(lab_path, record.machine, timeout_s, started_after=switched - 1.0, version=version)
                step.said = f"runs cetlab {version} from {lay.venvs}/{key}"
            except MachineError as exc:
                if not previous:
                    raise
                ssh.run(f"ln -sfn {remote.q(previous)} {remote.q(lay.venv)}")
                for command in remote.restart_agent(pre, record.machine):
                    ssh.run(command)
                await wait_online(lab_path, record.machine, timeout_s)
                rolled_back.append(record.machine)
                step.said = f"ROLLED BACK to {previous}: {exc}"
        if rolled_back:
            say(f"stopped the roll-out at {rolled_back[0]}: the machines after it keep what they run")
            break
    return progress.steps, rolled_back
