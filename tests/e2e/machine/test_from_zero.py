"""From nothing but SSH access to a working lab: `cetlab machine add` each machine (the one-machine lab answers at
once), lab.yaml shared by `cetlab lab push` (peer trust included: no key or known_hosts line written by hand), a
gateway policy changed live, `cetlab lab doctor` naming what a machine lacks, a training job, `cetlab lab upgrade`,
`cetlab machine remove`. One flow: it is the proof that a lab comes up from zero, so it runs in CI.

Each "machine" is a real OpenSSH sshd on a loopback port with a Unix user and home of its own (made here with
useradd, removed after); the operator reaches them with a key and an ssh config of their own, and the CLI runs in a
subprocess as a user runs it. Nothing is made by the demo: the wheelhouse is built from this checkout, copied over and
installed into a venv there with no package index; the agent runs detached (no systemd here).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest

from agents.runtime.keys import ensure_key
from agents.shell.demo.lab import free_ports
from tests.support.agent_process import wait_listening
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(900)  # five venvs installed on a shared CI box


SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


# a training job's shape without torch: steps printed, a checkpoint written into its output dir
COUNTING = (
    "import pathlib, sys\nfor step in (1, 2, 3):\n    print(f'step {step} of 3', flush=True)\n"
    "(pathlib.Path(sys.argv[1]) / 'checkpoint-3').mkdir(parents=True)"
)


SIM = {"load_s": 0.2, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1, "tokens_per_s": 0, "placeholder_mib": 1}


class Machine:
    """A Unix user with a home, reached through an sshd of its own on a loopback port."""

    def __init__(self, root: Path, user: str, operator_key: Path):
        self.user = user
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
        subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)  # no password, yet not locked for sshd
        entry = pwd.getpwnam(user)
        self.home, self.uid = Path(entry.pw_dir), entry.pw_uid
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text(Path(f"{operator_key}.pub").read_text())
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        base = root / f"sshd-{user}"
        base.mkdir()
        self.host_key = ensure_key(base / "ssh_host_ed25519_key")
        self.port = free_ports(1)[0]
        (base / "sshd_config").write_text(f"""ListenAddress 127.0.0.1
HostKey {base / "ssh_host_ed25519_key"}
PidFile {base / "sshd.pid"}
AuthorizedKeysFile .ssh/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
""")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(base / "sshd_config"), "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_listening("127.0.0.1", self.port, timeout=20)

    def processes(self) -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == self.uid]

    def agents(self) -> list[psutil.Process]:
        """Its user's cetlab agents that run (an exited one its new parent has not reaped yet is not one)."""
        found = []
        for process in self.processes():
            try:
                if "cetlab-agent" in " ".join(process.cmdline()):
                    found.append(process)
            except (psutil.ZombieProcess, psutil.NoSuchProcess):
                pass
        return found

    def remove(self) -> None:
        self.sshd.terminate()
        self.sshd.wait(timeout=10)
        for process in self.processes():  # what the machine's user still runs (an agent a failed test left), by pid
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        psutil.wait_procs(self.processes(), timeout=10)
        subprocess.run(["userdel", "-r", self.user], capture_output=True)


@pytest.fixture
def lab_machines(tmp_path):
    """Two machines and an operator (HOME, key, ssh config with an alias for the second, known_hosts)."""
    if os.geteuid() != 0:
        pytest.skip("the from-zero test makes Unix users (useradd) and runs sshd: it needs root (CI runs as root)")
    if not Path(SSHD).exists() or shutil.which("useradd") is None:
        pytest.skip("openssh-server (sshd) or useradd is not installed (apt-get install openssh-server)")
    home = tmp_path / "operator"
    key = home / ".ssh" / "id_ed25519"
    ensure_key(key, comment="operator@workstation")
    tag = f"{os.getpid() % 100000}"
    machines: list[Machine] = []
    try:
        for letter in "ab":
            machines.append(Machine(tmp_path, f"cz{tag}{letter}", key))
        known = "".join(f"[127.0.0.1]:{m.port} {m.host_key.export_public_key().decode().strip()}\n" for m in machines)
        (home / ".ssh" / "known_hosts").write_text(known)
        a, b = machines
        (home / ".ssh" / "config").write_text(f"""Host box-b
    HostName 127.0.0.1
    Port {b.port}
    User {b.user}

Host *
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {home / ".ssh" / "known_hosts"}
    StrictHostKeyChecking yes
""")
        yield home, machines
    finally:
        for machine in machines:
            machine.remove()


def build_copy(folder: Path, version: str, broken: bool = False) -> Path:
    """This checkout copied as another version (a newer build to roll out); `broken`: its agent exits at start."""
    root = Path(__file__).resolve().parents[3]
    for part in ("agents", "console", "widgets"):
        shutil.copytree(root / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "lab.yaml", "constraints.txt", "README.md"):
        shutil.copy(root / part, folder / part)
    for path in (folder / "pyproject.toml", folder / "agents" / "__init__.py"):
        path.write_text(path.read_text().replace('version = "0.1.0"', f'version = "{version}"').replace(
            '__version__ = "0.1.0"', f'__version__ = "{version}"'))  # fmt: skip
    if broken:
        daemon = folder / "agents" / "shell" / "daemon.py"
        daemon.write_text(daemon.read_text().replace("def main(argv: list[str] | None = None) -> int:\n",
                                                     "def main(argv: list[str] | None = None) -> int:\n    return 3\n"))  # fmt: skip
    return folder


def cetlab(
    home: Path, lab: Path, *args: str, timeout: float = 300, source: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "SSH_AUTH_SOCK", "CETLAB_"))}
    env["HOME"] = str(home)
    if source is not None:  # the CLI of another build of this package
        env["PYTHONPATH"] = str(source)
    return subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(lab), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=source,
    )  # fmt: skip


def add(home: Path, lab: Path, *args: str) -> tuple[dict, str]:
    done = cetlab(home, lab, "--json", "machine", "add", *args, "--ssh-config", str(home / ".ssh" / "config"))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout), done.stderr


def pushed(home: Path, lab: Path) -> dict:
    done = cetlab(home, lab, "--json", "lab", "push")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def chat(client: openai.OpenAI, model: str, max_tokens: int = 4) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=max_tokens)
    return reply.choices[0].message.content or ""


def wait_answered(client: openai.OpenAI, model: str, timeout: float = 90) -> str:
    """The model's answer through the gateway, once its link to the model's machine is up (a 503 until then, at once:
    the peer link retries with a backoff and is trusted at its next attempt after the push)."""

    def answered() -> str | None:
        try:
            return chat(client, model)
        except openai.APIStatusError as exc:
            if exc.status_code != 503:
                raise
            return None

    return wait_until(answered, timeout, interval=0.2, what=f"an answer from {model} through the gateway")


def replace_once(lab: Path, old: str, new: str) -> None:
    text = lab.read_text()
    assert text.count(old) == 1, (old, text)
    lab.write_text(text.replace(old, new))


def sim_model(name: str, machine: str) -> str:
    return f"  - {{name: {name}, path: models/{name}, engine: sim, machine: {machine}, vram_gib: 1, sim: {json.dumps(SIM)}}}\n"


def test_from_nothing_to_a_lab_pushed_live_and_a_machine_removed(lab_machines, tmp_path):
    home, (a, b) = lab_machines
    lab = tmp_path / "workstation" / "lab.yaml"
    port_a, port_b, gateway_port = free_ports(3)
    # the operator's lab.yaml before any machine is in it: a model and the gateway, both on a (the one-machine lab)
    lab.parent.mkdir()
    gateway_line = f"gateway: {{machine: a, host: 127.0.0.1, port: {gateway_port}}}\n"
    lab.write_text(
        "lab: lab\n# the first model: simulated on a, served by a's gateway\nmodels:\n" + sim_model("tiny", "a") + gateway_line
    )
    written = lab.read_text()
    started = time.monotonic()

    # --dry-run: the plan, every changing command printed, nothing changed (not lab.yaml, not the machine)
    plan = cetlab(home, lab, "machine", "add", "a", f"{a.user}@127.0.0.1:{a.port}", "--agent-port", str(port_a),
                  "--ssh-config", str(home / ".ssh" / "config"), "--dry-run")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert f"would run on {a.user}@127.0.0.1:{a.port}: " in plan.stdout and "pip install" in plan.stdout, plan.stdout
    assert "--no-index" in plan.stdout and "would install cetlab" in plan.stdout and "installed cetlab" not in plan.stdout
    assert "would push" in plan.stdout
    assert lab.read_text() == written and not (a.home / ".local").exists()

    # one command, and the one-machine lab answers: the gateway reaches the engines of its own machine directly
    first, said = add(home, lab, "a", f"{a.user}@127.0.0.1:{a.port}", "--agent-port", str(port_a))
    steps_a = {s["step"]: s for s in first["steps"]}
    assert "started detached" in said and "will not survive a reboot" in said
    assert first["ok"] and "online" in steps_a and "pushed to 1 machine" in said, said
    assert (a.home / ".local" / "share" / "cetlab" / "venv" / "bin" / "cetlab-agent").exists()
    pinned = (home / ".config" / "cetlab" / "known_hosts").read_text()
    assert f"[127.0.0.1]:{port_a} ssh-ed25519 " in pinned  # pinned from the machine itself: no trust on first use
    keys = cetlab(home, lab, "--json", "gateway", "keys", "add", "from-zero")
    assert keys.returncode == 0, keys.stderr
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=json.loads(keys.stdout)["key"], max_retries=0, timeout=120
    )
    assert chat(client, "tiny")
    first_answer_s = time.monotonic() - started

    # b joins with one command: its agent starts from a copy of lab.yaml, then the push gives a (running, not
    # restarted) the lab with b in it and the peer trust both ways: nobody writes a key or a known_hosts line
    gateway_agent = {p.pid for p in a.agents()}
    second, said = add(home, lab, "b", "box-b", "--agent-port", str(port_b))  # an ~/.ssh/config alias
    assert "pushed to 2 machines, applied live" in said and "authorized: gateway@a" in said, said
    assert {p.pid for p in a.agents()} == gateway_agent
    status = json.loads(cetlab(home, lab, "--json", "status").stdout)
    assert {m["name"]: (m["online"], m["lab_differs"]) for m in status["machines"]} == {"a": (True, False), "b": (True, False)}

    # the name a at another place: refused after the read-only pre-flight, before anything changes
    elsewhere = str(free_ports(1)[0])
    clash = cetlab(
        home, lab, "machine", "add", "a", "box-b", "--agent-port", elsewhere, "--ssh-config", str(home / ".ssh" / "config")
    )
    assert clash.returncode == 1 and f"already in lab.yaml at 127.0.0.1:{port_a}, not 127.0.0.1:{elsewhere}" in clash.stderr, (
        clash.stdout + clash.stderr
    )
    assert "nothing was changed" in clash.stderr

    # again: every step says it is done already (resumable), and the agent keeps running
    again, said = add(home, lab, "b", "box-b")
    assert "already installed" in said and "already running" in said and "already pinned" in said, said

    # a model and a training recipe on b, pushed: a's gateway answers for b's model
    replace_once(lab, sim_model("tiny", "a"), sim_model("tiny", "a") + sim_model("small", "b"))
    lab.write_text(lab.read_text() + "trainers:\n  - {name: counting, machine: b, output_dir: 'runs/{job_id}', command: "
                   f"[python3, -c, {json.dumps(COUNTING)}, '{{output_dir}}']}}\n")  # fmt: skip
    pushing = time.monotonic()
    one = pushed(home, lab)
    assert one["b"]["live"] == ["models: +small", "recipes: +counting"] and one["b"]["restart"] == [], one
    assert wait_answered(client, "small")
    answer_through_peer_s, push_to_peer_answer_s = time.monotonic() - started, time.monotonic() - pushing
    assert chat(client, "small", max_tokens=16)

    # a gateway policy, live: the running gateway refuses what the new max_tokens does not allow; and a llama.cpp
    # model on b whose llama-server and GGUF b does not have
    replace_once(lab, gateway_line, gateway_line.replace("}\n", ", policies: {max_tokens: 8}}\n"))
    replace_once(
        lab,
        sim_model("small", "b"),
        sim_model("small", "b") + "  - {name: gguf, path: models/gguf.gguf, engine: llamacpp, machine: b}\n",
    )
    two = pushed(home, lab)
    assert two["a"]["live"] == ["gateway", "models: +gguf"] and two["a"]["restart"] == [], two
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, "small", max_tokens=16)
    assert "8" in str(refused.value.body), refused.value.body
    assert chat(client, "small", max_tokens=4)
    assert {p.pid for p in a.agents()} == gateway_agent  # no restart: the same agent enforces the new policy

    # the lab's doctor reads what lab.yaml now places on b: the missing llama-server and GGUF, each with its fix
    doctor = cetlab(home, lab, "lab", "doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "-m agents.orchestra.engines.llamacpp.build" in doctor.stdout and "gguf.gguf does not exist" in doctor.stdout, (
        doctor.stdout
    )
    replace_once(lab, "  - {name: gguf, path: models/gguf.gguf, engine: llamacpp, machine: b}\n", "")
    assert pushed(home, lab)["b"]["live"] == ["models: -gguf"]
    timings = {
        "first_answer_s": round(first_answer_s, 1),
        "answer_through_peer_s": round(answer_through_peer_s, 1),
        "push_to_peer_answer_s": round(push_to_peer_answer_s, 1),
        "add_a": {s["step"]: s["seconds"] for s in first["steps"]},
        "add_b_s": round(sum(s["seconds"] for s in second["steps"]), 1),
        "add_again_s": round(sum(s["seconds"] for s in again["steps"]), 1),
    }
    print("from zero:", json.dumps(timings))

    # a training job on b (a CPU recipe of plain Python: torch is the GPU stack machine add prints, not installs)
    trained = cetlab(home, lab, "train", "counting", "--follow")
    assert trained.returncode == 0 and "step 3 of 3" in trained.stdout, trained.stdout + trained.stderr

    # lab upgrade to a newer build (a copy of this checkout as 0.1.1): one machine at a time, each back on the new venv
    newer = build_copy(tmp_path / "newer", "0.1.1")
    upgraded = cetlab(home, lab, "lab", "upgrade", source=newer)
    assert upgraded.returncode == 0, upgraded.stderr + upgraded.stdout
    assert upgraded.stdout.count("runs cetlab 0.1.1") == 2, upgraded.stdout
    assert chat(client, "tiny")  # the gateway's new agent serves on
    # a build whose agent cannot start: b gets its previous venv back and answers on it; the error says so
    broken = build_copy(tmp_path / "broken", "0.1.2", broken=True)
    failed = cetlab(home, lab, "lab", "upgrade", "--machine", "b", "--wait", "15", source=broken)
    assert failed.returncode == 1 and "ROLLED BACK" in failed.stdout and "rolled back: b" in failed.stderr, failed.stdout
    status = cetlab(home, lab, "--json", "status", source=newer)
    assert {m["name"]: m["online"] for m in json.loads(status.stdout)["machines"]} == {"a": True, "b": True}

    # b cannot leave lab.yaml while a model and the recipe are placed on it (said before anything changes)
    kept = cetlab(home, lab, "machine", "remove", "b")
    assert kept.returncode == 1 and "no machine named 'b'" in kept.stderr, kept.stderr
    assert f"{lab}:" in kept.stderr and b.agents()
    replace_once(lab, sim_model("small", "b"), "")
    lab.write_text(lab.read_text().split("trainers:")[0])

    # remove b: its agent ends, its key and entry go, the operator's comment stays, its state is kept; a gets the
    # lab.yaml without b by a push (its gateway drops the link)
    gone = cetlab(home, lab, "machine", "remove", "b")
    assert gone.returncode == 0, gone.stderr
    assert "pushed to 1 machine" in gone.stdout and "machines: -b" in gone.stdout, gone.stdout
    assert not b.agents()
    assert "name: b" not in lab.read_text() and "# the first model" in lab.read_text()
    assert f"[127.0.0.1]:{port_b}" not in (home / ".config" / "cetlab" / "known_hosts").read_text()
    assert (b.home / ".local" / "state" / "cetlab" / "agent-b").is_dir()  # runs and checkpoints stay without --purge
    assert chat(client, "tiny")
    # a: the model and the gateway are placed on it, so lab.yaml cannot lose it; said before anything changes
    refused_remove = cetlab(home, lab, "machine", "remove", "a", "--purge")
    assert refused_remove.returncode == 1 and "would leave a lab.yaml that does not load" in refused_remove.stderr
    assert a.agents()
