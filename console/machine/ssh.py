"""The operator's own OpenSSH as `cetlab machine` uses it, and the wheelhouse it copies over.

Plain `ssh` processes: the operator's ~/.ssh/config, ssh-agent and jump hosts apply as they do to any ssh they run
(console/lab/openssh.py is another path: the agent's own port, with the console's key and no user config). BatchMode:
a prompt ssh would need (a password, an unknown host) is a failure that says so, never a hang.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

SSH_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
SSH_HOST = re.compile(r"[A-Za-z0-9_.:-]{1,253}")
COMMAND_TIMEOUT_S = 900.0  # a pip install on a slow disk; a hung ssh ends here with what it said


class MachineError(Exception):
    """A step failed: the message says what and how to fix it."""


@dataclass(frozen=True)
class Target:
    """USER@HOST[:PORT] as the operator's ssh reaches the machine (HOST may be a ~/.ssh/config alias)."""

    user: str | None
    host: str
    port: int | None

    @classmethod
    def parse(cls, text: str) -> Target:
        user, _, rest = text.rpartition("@")
        host, port = rest, None
        if rest.startswith("["):  # [::1]:2222
            host, _, tail = rest[1:].partition("]")
            port = tail.removeprefix(":") or None
        elif rest.count(":") == 1:
            host, port = rest.split(":")
        if user and not SSH_USER.fullmatch(user):
            raise MachineError(f"{text!r}: {user!r} is not a user name")
        if not SSH_HOST.fullmatch(host) or host.startswith("-"):
            raise MachineError(f"{text!r}: expected USER@HOST[:PORT], and {host!r} is not a host name or address")
        if port is not None and (not port.isdigit() or not 1 <= int(port) <= 65535):
            raise MachineError(f"{text!r}: the ssh port {port!r} is not a port number (1-65535)")
        return cls(user or None, host, int(port) if port else None)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and self.port else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


def one_arg(command: str) -> str:
    """`command` as one shell word a person reads: in single quotes, or in double quotes where it holds single quotes
    (a quoted path) and nothing a double quote expands, so no quote is nested in another's."""
    if "'" in command and not any(c in command for c in '"$`\\!'):
        return f'"{command}"'
    return shlex.quote(command)


@dataclass
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Ssh:
    """Runs commands on one machine; with dry_run, a command that changes something is printed, not run."""

    target: Target
    ssh_config: Path | None = None
    dry_run: bool = False
    say: Callable[[str], None] = print
    commands: list[str] = field(default_factory=list)

    def argv(self, command: str) -> list[str]:
        out = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15"]
        if self.ssh_config is not None:
            out += ["-F", str(self.ssh_config)]
        if self.target.port:
            out += ["-p", str(self.target.port)]
        if self.target.user:
            out += ["-l", self.target.user]
        return out + ["--", self.target.host, command]

    def plain(self) -> str:
        """The ssh command line an operator would type to reach the machine."""
        port = f"-p {self.target.port} " if self.target.port else ""
        config = f"-F {shlex.quote(str(self.ssh_config))} " if self.ssh_config else ""
        return f"ssh {config}{port}{self.target.user + '@' if self.target.user else ''}{self.target.host}"

    def resolved_host(self) -> str:
        """The address ssh dials for the target (`ssh -G`: the config's HostName), which the console dials the agent at."""
        argv = self.argv("true")[:-2]
        argv[argv.index("--")] = "-G"
        ran = subprocess.run([*argv, self.target.host], capture_output=True, text=True, timeout=30)
        for line in ran.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                return value.strip()
        return self.target.host

    def would(self) -> str:
        """A dry run's heading: where the commands it prints run, and how to reach that shell."""
        return f"  dry run, nothing changes: each `would run on {self.target}:` is a command for a shell there ({self.plain()})"

    def run(
        self, command: str, *, stdin: bytes | None = None, stdin_from: str | None = None, changes: bool = True, check: bool = True
    ) -> Ran:
        """Run `command` in the machine's shell; with dry_run, one that changes something is printed as that shell reads
        it (no second layer of quoting), its input as `< FILE` where it comes from one (`stdin_from`)."""
        self.commands.append(command)
        if self.dry_run and changes:
            given = f" < {shlex.quote(stdin_from)}" if stdin_from else "  (its input on stdin)" if stdin is not None else ""
            self.say(f"    would run on {self.target}: {command}{given}")
            return Ran(0, "", "")
        try:
            done = subprocess.run(
                self.argv(command), input=stdin if stdin is not None else b"", capture_output=True, timeout=COMMAND_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise MachineError(f"{self.target}: no end after {COMMAND_TIMEOUT_S:.0f} s: {command}") from None
        ran = Ran(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
        if check and ran.code != 0:
            said = (ran.err.strip() or ran.out.strip())[-1500:]
            if ran.code == 255:  # ssh's own failure: the machine was not reached
                raise MachineError(
                    f"ssh {self.target} failed: {said}\n  fix: make `{self.plain()} true` work first (key, "
                    "~/.ssh/config, known_hosts); cetlab uses your ssh as it is"
                )
            raise MachineError(f"on {self.target}, `{command[:200]}` exited with {ran.code}: {said}")
        return ran

    def send_tree(self, folder: Path, command: str) -> None:
        """Pipe a folder as a tar stream into `command` on the machine (`tar -xf -` there)."""
        self.commands.append(command)
        if self.dry_run:
            self.say(f"    would run here: tar -C {shlex.quote(str(folder))} -cf - . | {self.plain()} {one_arg(command)}")
            return
        with subprocess.Popen(["tar", "-C", str(folder), "-cf", "-", "."], stdout=subprocess.PIPE) as tar:
            done = subprocess.run(self.argv(command), stdin=tar.stdout, capture_output=True, timeout=COMMAND_TIMEOUT_S)
        if done.returncode != 0 or tar.returncode != 0:
            raise MachineError(f"copying {folder} to {self.target} failed: {done.stderr.decode(errors='replace')[-1000:]}")


# ---------------------------------------------------------------------------- the wheelhouse


def source_tree() -> Path | None:
    """The checkout this cetlab runs from (a source tree with pyproject.toml), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "agents").is_dir() else None


def package_version() -> str:
    tree = source_tree()
    if tree is not None:
        return str(tomllib.loads((tree / "pyproject.toml").read_text())["project"]["version"])
    return metadata.version("cetlab")


def wheelhouse_key() -> str:
    """The cache key: the version and this Python (cp311); from a checkout also a hash of its sources, so an edit is
    a new wheelhouse, not a stale one under the same version."""
    key = f"cetlab-{package_version()}-cp{sys.version_info[0]}{sys.version_info[1]}"
    tree = source_tree()
    if tree is None:
        return key
    digest = hashlib.sha256()
    for path in sorted(
        [
            tree / "pyproject.toml",
            tree / "lab.yaml",
            *[p for d in ("agents", "console", "widgets") for p in (tree / d).rglob("*")],
        ]
    ):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes())
    return f"{key}-{digest.hexdigest()[:10]}"


def build_wheelhouse(cache: Path, key: str, dry_run: bool, say: Callable[[str], None] = print) -> tuple[Path, bool]:
    """This package and only its dependencies as wheels, under the cache dir per key; (folder, built now)."""
    folder = cache / key
    if (folder / ".complete").exists():
        return folder, False
    tree = source_tree()
    what = [str(tree)] if tree is not None else [f"cetlab=={package_version()}"]
    constraints = tree / "constraints.txt" if tree is not None else None
    partial = cache / f".{key}.partial"
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--wheel-dir", str(partial)]
    argv += ["-c", str(constraints)] if constraints is not None and constraints.exists() else []
    argv += what
    if dry_run:
        say(f"    would run here: {shlex.join(argv)}")
        return folder, True
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if done.returncode != 0:
        said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))[-1500:]
        raise MachineError(f"building the wheelhouse failed ({shlex.join(argv)}):\n{said}")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    (folder / ".complete").write_text(f"built in {time.monotonic() - started:.1f} s\n")
    return folder, True
