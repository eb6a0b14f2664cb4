"""Real agent processes, real SSH on loopback: hello, stream, history, auth, bad messages, reconnects."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.lab import openssh


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=x", "a b", "evil@127.0.0.1", "ssh://127.0.0.1:22", "127.0.0.%31", "'h'", "h\n", ""]
)
def test_a_host_ssh_would_read_as_more_than_a_host_keeps_to_asyncssh(host, tmp_path):
    """user@host and ssh://host:port mean something else to ssh than to asyncssh; an option must never reach it."""
    assert openssh.argv(host, 22, tmp_path / "key", tmp_path / "kh", 5, 15) is None


@pytest.mark.parametrize("folder", ['q"uote', "back\\slash", "back\\\\slashes", "new\nline", "${HOME}"])
def test_a_key_path_ssh_would_read_as_another_file_keeps_to_asyncssh(folder, tmp_path):
    assert openssh.argv("127.0.0.1", 22, tmp_path / folder / "key", tmp_path / "kh", 5, 15) is None
    assert openssh.argv("127.0.0.1", 22, tmp_path / "key", tmp_path / folder / "kh", 5, 15) is None


def test_plain_hosts_and_paths_with_blanks_and_percent_go_to_ssh_quoted(tmp_path):
    command = openssh.argv("gpu-box.lab", 2222, tmp_path / "my keys" / "id%h", tmp_path / "kh", 5, 15)
    assert command is not None and command[-3:] == ["--", "gpu-box.lab", "cetlab"]
    assert f'IdentityFile="{tmp_path}/my keys/id%%h"' in command and "StrictHostKeyChecking=yes" in command
    assert openssh.argv("::1", 22, tmp_path / "key", tmp_path / "kh", 5, 15) is not None
    tilde = openssh.argv("box", 22, Path("~root/key"), tmp_path / "kh", 5, 15)  # a folder named so, here
    assert tilde is not None and f'IdentityFile="{Path.cwd()}/~root/key"' in tilde
    patient = openssh.argv("box", 22, tmp_path / "key", tmp_path / "kh", 1e300, 0.1)  # lab.yaml allows any positive number
    assert patient is not None and "ConnectTimeout=2147483647" in patient and "ServerAliveInterval=1" in patient
