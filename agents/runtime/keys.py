"""Key files: the agent's host key and its authorized keys with a role per key."""

from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from agents.wire.protocol import Role

if TYPE_CHECKING:  # asyncssh is loaded where keys are read or made: the CLI's file checks need none of it
    import asyncssh

HOST_KEY_NAME = "ssh_host_ed25519_key"
AUTHORIZED_KEYS_NAME = "authorized_keys"
PUSHED_AUTHORIZED_KEYS_NAME = "authorized_keys.pushed"  # the peer keys `cetlab lab push` authorized (agents/runtime/labfile.py)
PUSHED_ROLES = frozenset(
    {Role.GATEWAY, Role.NODE, Role.SCHEDULER}
)  # all a push may grant: an agent's calls to another, never a person's


class KeyFileError(Exception):
    """A key file is missing, unreadable, malformed or too open."""


def check_private(path: Path) -> None:
    """Refuse a secret file that group or others can read or write."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path} is too open (mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}")


def check_not_writable_by_others(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(f"{path} is writable by others (mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}")


class StateDirError(KeyFileError):
    """The agent's state dir is unsafe (writable by others) or in use by another agent."""


def prepare_state_dir(path: Path) -> None:
    """Create the state dir (mode 700); refuse an existing one that group or others can write."""
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        return
    mode = path.stat().st_mode
    if not stat.S_ISDIR(mode):
        raise StateDirError(f"state dir {path} is not a folder")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(f"state dir {path} is writable by others (mode {stat.S_IMODE(mode):o}); run: chmod 700 {path}")


def write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def open_private_log(path: Path) -> BinaryIO:
    """A log to append to, mode 600 (an older one at 644 is made 600): what a log records can be a secret's neighbour,
    e.g. a webhook's path holds its token."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def ensure_key(path: Path, comment: str = "") -> asyncssh.SSHKey:
    """Load an ed25519 private key, generating it (mode 600, plus .pub) the first time."""
    import asyncssh

    if path.exists():
        check_private(path)
        try:
            return asyncssh.read_private_key(path)
        except (asyncssh.KeyImportError, OSError) as exc:
            raise KeyFileError(f"{path}: not a readable private key: {exc}") from None
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment or None)
    write_private(path, key.export_private_key())
    Path(f"{path}.pub").write_bytes(key.export_public_key())
    return key


@dataclass(frozen=True)
class AuthorizedKey:
    role: Role
    key: asyncssh.SSHKey
    comment: str

    @property
    def who(self) -> str:
        return self.comment or self.key.get_fingerprint()


def _control_characters(text: str) -> list[str]:
    """The control and line-separating characters in text (other than the tab), as escapes."""
    return sorted({repr(c)[1:-1] for c in text if c != "\t" and (unicodedata.category(c) in ("Cc", "Zl", "Zp") or c == "\x85")})


def parse_authorized_keys(text: str, source: str = "authorized_keys") -> list[AuthorizedKey]:
    """Lines of ``<role> <key-type> <base64> [comment]``; # comments and blank lines allowed.

    Lines end at ``\n`` only (what `cat` and `wc -l` show); a line holding any other control or
    line-separating character is refused, so no comment can smuggle in a second entry.
    """
    import asyncssh

    entries = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r").strip(" \t")
        if not line or line.startswith("#"):
            continue
        odd = _control_characters(line)
        if odd:
            raise KeyFileError(f"{source}:{number}: control characters ({', '.join(odd)}) in a key line; remove them")
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[0] not in Role._value2member_map_:
            raise KeyFileError(f"{source}:{number}: expected '<viewer|operator> <key-type> <base64> [comment]'")
        try:
            key = asyncssh.import_public_key(f"{parts[1]} {parts[2]}")
        except asyncssh.KeyImportError as exc:
            raise KeyFileError(f"{source}:{number}: not a public key: {exc}") from None
        entries.append(AuthorizedKey(Role(parts[0]), key, parts[3] if len(parts) > 3 else ""))
    return entries


class AuthorizedKeys:
    """The authorized-keys file, re-read when it changes so keys can be added live; with ``pushed``, the file of the
    keys a lab push authorized beside it, whose entries count with the gateway or node role only."""

    def __init__(self, path: Path, pushed: Path | None = None):
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._entries: list[AuthorizedKey] = []
        self.pushed = AuthorizedKeys(pushed) if pushed is not None else None

    def entries(self) -> list[AuthorizedKey]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)
        if stamp != self._stamp:
            check_not_writable_by_others(self.path)
            self._entries = parse_authorized_keys(self.path.read_text(), str(self.path))
            self._stamp = stamp
        return self._entries

    def lookup(self, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        """The entry of this key: the hand-made file first (its role wins), then the pushed one's (gateway or node)."""
        blob = key.public_data
        for entry in self.entries():
            if entry.key.public_data == blob:
                return entry
        return self.pushed.lookup_pushed(key) if self.pushed is not None else None

    def lookup_pushed(self, key: asyncssh.SSHKey) -> AuthorizedKey | None:
        """As a pushed file: an unreadable one lets none of its keys in (and never locks the hand-made ones out); an
        entry with any other role than gateway or node is ignored."""
        try:
            entries = self.entries()
        except KeyFileError:
            return None
        blob = key.public_data
        return next((e for e in entries if e.key.public_data == blob and e.role in PUSHED_ROLES), None)

    def add(self, role: Role, public_key: str) -> AuthorizedKey:
        """Append one key (``ssh-ed25519 AAAA... comment``) with a role; replaces an existing role.

        Exactly one key per call, and no control characters in its comment: the line written
        must read back as this one entry and nothing else.
        """
        import asyncssh

        lines = [line for line in public_key.split("\n") if line.strip() and not line.lstrip().startswith("#")]
        if len(lines) != 1:
            raise KeyFileError(f"expected exactly one public key line like 'ssh-ed25519 AAAA... comment', got {len(lines)}")
        line = lines[0].removesuffix("\r").strip(" \t")
        odd = _control_characters(line)
        if odd:
            raise KeyFileError(f"control characters ({', '.join(odd)}) in the public key line; refusing it")
        parts = line.split(None, 2)
        if len(parts) < 2:
            raise KeyFileError("expected a public key line like 'ssh-ed25519 AAAA... comment'")
        try:
            key = asyncssh.import_public_key(f"{parts[0]} {parts[1]}")
        except asyncssh.KeyImportError as exc:
            raise KeyFileError(f"not a public key: {exc}") from None
        comment = parts[2] if len(parts) > 2 else ""
        kept = [e for e in (self.entries() if self.path.exists() else []) if e.key.public_data != key.public_data]
        entry = AuthorizedKey(role, key, comment)
        lines = [
            f"{e.role} {e.key.export_public_key().decode().split()[0]} {e.key.export_public_key().decode().split()[1]} {e.comment}".rstrip()
            for e in kept + [entry]
        ]
        write_private(self.path, ("\n".join(lines) + "\n").encode())
        return entry
