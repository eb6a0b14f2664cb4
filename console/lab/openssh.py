"""The system's OpenSSH client as a one-shot transport to an agent (`via: agent`).

The CLI is a process started cold for each verb, and importing asyncssh (with the parts of
`cryptography` it loads) is about a third of its start. For one-shot verbs the CLI runs
`ssh -s cetlab` instead: the same SSH session channel and subsystem as asyncssh opens,
the same console key and the same known_hosts file, strict host-key checking, key-only
auth and no user ssh config (`-F /dev/null`), so what it trusts does not change. The
console (long-lived, reconnecting) and trust-on-first-use keep asyncssh.

What can fail before the first reply (an unknown host key, a refused key, nobody
listening) is read from ssh's own error lines and given the same link status and words
as the asyncssh path (`classify`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from agents.runtime.waits import within
from agents.wire.protocol import SSH_USERNAME, SUBSYSTEM, ErrorCode, LinkStatus, RemoteError

STDERR_KEEP_BYTES = 16 * 1024  # ssh says what failed in a line or two
# A host ssh takes as asyncssh does: a name or an address, nothing ssh reads as more (user@, ssh://, an option)
PLAIN_HOST = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*")
SSH_MAX_SECONDS = 2**31 - 1  # ssh refuses a longer time value (and so the link), where asyncssh waits that long


class SshFailed(RemoteError):
    """The ssh process ended; `link_status` is how the link reads (offline, refused or untrusted)."""

    def __init__(self, link_status: LinkStatus, message: str):
        super().__init__(ErrorCode.DISCONNECTED, message)
        self.link_status = link_status


def available() -> bool:
    """Use OpenSSH for one-shot verbs unless CETLAB_SSH=asyncssh or there is no `ssh` on PATH."""
    return os.environ.get("CETLAB_SSH", "auto").strip().lower() != "asyncssh" and shutil.which("ssh") is not None


def _option_path(path: Path) -> str | None:
    """A path as an ssh option value: ssh expands %-tokens and splits on blanks unless quoted.

    None for what has no one spelling across OpenSSH versions: a quote, a backslash (9.x reads
    `\\\\` inside quotes as one backslash), `${` (8.4+ puts an environment variable there), or a
    control character; ssh would read another file than asyncssh does.
    """
    text = os.path.abspath(path)  # relative, a leading `~x` would be user x's home to ssh
    if '"' in text or "\\" in text or "${" in text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        return None
    return '"' + text.replace("%", "%%") + '"'


def _seconds(value: float) -> str:
    return str(min(SSH_MAX_SECONDS, max(1, round(value))))


def argv(host: str, port: int, key: Path, known_hosts: Path, connect_timeout_s: float, keepalive_s: float) -> list[str] | None:
    """The ssh command line, or None where a value cannot be passed to ssh safely (then asyncssh is used)."""
    key_value, known_value = _option_path(key), _option_path(known_hosts)
    if key_value is None or known_value is None or not PLAIN_HOST.fullmatch(host):
        return None
    options = {
        "IdentityFile": key_value,
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "PreferredAuthentications": "publickey",
        "BatchMode": "yes",  # never a prompt: a question ssh would ask is a refusal
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": known_value,
        "GlobalKnownHostsFile": "/dev/null",
        "CheckHostIP": "no",
        "UpdateHostKeys": "no",
        "ConnectTimeout": _seconds(connect_timeout_s),
        "ServerAliveInterval": _seconds(keepalive_s),
        "ServerAliveCountMax": "2",
        "ControlMaster": "no",
        "ControlPath": "none",
        "ClearAllForwardings": "yes",
        "LogLevel": "ERROR",
    }
    out = ["ssh", "-F", "/dev/null", "-T", "-s", "-p", str(port), "-l", SSH_USERNAME]
    for name, value in options.items():
        out += ["-o", f"{name}={value}"]
    return out + ["--", host, SUBSYSTEM]


class PipeReader:
    """asyncssh's reader contract over a pipe: readline() gives a line, or a piece of a long one, b"" at the end."""

    def __init__(self, stream: asyncio.StreamReader):
        self._stream = stream

    async def readline(self) -> bytes:
        try:
            return await self._stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:  # the end: what is left, then b""
            return exc.partial
        except asyncio.LimitOverrunError as exc:  # longer than the buffer: hand it on in pieces
            return await self._stream.read(max(1, exc.consumed))


@dataclass
class Session:
    process: asyncio.subprocess.Process
    reader: PipeReader
    writer: asyncio.StreamWriter
    _stderr: asyncio.Task[bytes]
    _pidfd: int | None = None  # ssh's pid as a file (Linux): signalled without a wait that could reap it
    _reaped: bool = False  # gone before its pidfd could be opened: nothing to signal

    async def failure(self, timeout_s: float) -> SshFailed:
        """Why the stream ended: ssh's exit and its error lines, in the asyncssh path's words."""
        try:
            code = await within(self.process.wait(), timeout_s)
        except TimeoutError:
            code = None
        try:
            text = (await within(self._stderr, 1.0)).decode(errors="replace")
        except (TimeoutError, asyncio.CancelledError):
            text = ""
        return classify(code, text)

    async def close(self) -> None:
        if self.writer.can_write_eof():
            self.writer.close()
        if self.process.returncode is None:
            self._terminate()
        await self.process.wait()
        self._stderr.cancel()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _terminate(self) -> None:
        """SIGTERM to ssh, without reaping it. Popen's terminate() polls first (waitpid WNOHANG): an ssh that has just
        exited (offline: refused, timed out) was reaped there, before asyncio's child watcher could, which then
        printed "Unknown child process pid N" and reported exit code 255. A pidfd names this process only, even
        once it has exited (a zombie until the watcher reaps it), so the signal never reaches a reused pid."""
        if self._reaped:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)
            else:  # no pidfds on this system: Popen's way, its race included
                self.process.terminate()
        except ProcessLookupError:  # exited and reaped already
            pass


async def _read_stderr(stream: asyncio.StreamReader) -> bytes:
    kept = b""
    while chunk := await stream.read(4096):
        kept = (kept + chunk)[-STDERR_KEEP_BYTES:]
    return kept


async def open_session(command: list[str]) -> Session:
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C reaches the CLI, which closes ssh itself
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stderr = asyncio.create_task(_read_stderr(process.stderr))
    session = Session(process, PipeReader(process.stdout), process.stdin, stderr)
    pidfd_open = getattr(os, "pidfd_open", None)  # Linux 5.3+
    if pidfd_open is not None:
        try:
            session._pidfd = pidfd_open(process.pid)  # not inherited (O_CLOEXEC): ssh's later children never hold it
        except ProcessLookupError:  # exited and already reaped by the child watcher
            session._reaped = True
        except OSError:  # an older kernel: Popen's way
            pass
    return session


async def key_problem(key: Path) -> str | None:
    """Why ssh cannot use the console key, or None: ssh itself says only "Permission denied" for a key
    it cannot load (one with a passphrase, or a public key), which would read as a key the agent refused."""
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        return None
    process = await asyncio.create_subprocess_exec(
        keygen,
        "-y",
        "-P",
        "",
        "-f",
        str(key),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    if process.returncode == 0:
        return None
    said = stderr.decode(errors="replace").strip().splitlines()
    if said and "passphrase" in said[-1]:
        return "it is protected by a passphrase, which a console cannot type: use a key without one"
    return said[-1] if said else f"ssh-keygen cannot read it (exit {process.returncode})"


def classify(exit_code: int | None, stderr: str) -> SshFailed:
    """ssh's exit as the link's status and a message; `untrusted` and `refused` get their full words in the client."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = "\n".join(lines)
    last = lines[-1] if lines else ""
    if (
        "Host key verification failed" in text
        or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text
        or "host key is known for" in text
    ):
        return SshFailed(LinkStatus.UNTRUSTED, last)
    if text.startswith("Load key") or "\nLoad key" in text:
        return SshFailed(LinkStatus.REFUSED, "key: " + next(line for line in lines if line.startswith("Load key")))
    if "Permission denied" in text:
        return SshFailed(LinkStatus.REFUSED, last)
    if "Connection refused" in text:
        return SshFailed(LinkStatus.OFFLINE, "connection refused (is the agent running?)")
    if "timed out" in text.lower():
        return SshFailed(LinkStatus.OFFLINE, "no answer (timed out)")
    if exit_code is None:
        return SshFailed(LinkStatus.OFFLINE, "the connection ended, and ssh did not exit")
    if last:
        return SshFailed(LinkStatus.OFFLINE, last.removeprefix("ssh: "))
    return SshFailed(LinkStatus.OFFLINE, f"the agent closed the connection (ssh exited with {exit_code})")
