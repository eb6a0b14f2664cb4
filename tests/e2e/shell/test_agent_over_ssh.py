"""Real agent processes, real SSH on loopback: hello, stream, history, auth, bad messages, reconnects."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import asyncssh
import pytest

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key
from agents.runtime.waits import within
from agents.wire.lab.model import load_lab
from agents.wire.protocol import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, ErrorCode, RemoteError
from console.lab import openssh
from console.lab.client import FleetClient
from tests.support.waits import wait_for


async def connected(demo, **kwargs) -> FleetClient:
    client = FleetClient(load_lab(demo.lab_path), **kwargs)
    await client.start()
    await client.wait_connected(15)
    return client


async def test_hello_stream_and_history(small_demo):
    client = await connected(small_demo)
    try:
        view = client.state.machines["box"]
        assert view.link == "online", view.error
        assert view.hello.protocol == PROTOCOL_VERSION
        assert view.hello.role == "operator"
        assert view.hello.simulated is True
        assert "telemetry" in view.hello.capabilities
        first = await wait_for(lambda: view.sample_t)
        await wait_for(lambda: view.sample_t > first + 1.5)  # the stream keeps coming
        gpu = view.gpus[0]
        assert gpu.name == "Tesla P4" and gpu.simulated is True
        assert gpu.mem_total_bytes == 8 * 1024**3
        assert 0 <= gpu.util_pct <= 100 and gpu.power_w > 0
        assert view.host.ram_total_bytes > 0
        history = await client.call("box", "history", {"max_points": 3600})
        assert len(history["t"]) >= 3 and history["simulated"] is True
        assert len(history["gpus"][0]["power_w"]) == len(history["t"])
        assert history["t"] == sorted(history["t"])
        limited = await client.call("box", "history", {"max_points": 2})
        assert len(limited["t"]) <= 2
    finally:
        await client.stop()


async def test_reconnects_after_the_agent_is_killed_and_restarted(small_demo):
    client = await connected(small_demo)
    try:
        view = client.state.machines["box"]
        assert view.online
        small_demo.processes[0].kill()
        small_demo.processes[0].wait()
        small_demo.processes.clear()
        await wait_for(lambda: view.link == "offline", timeout=20)
        assert view.last_seen is not None and view.error
        with pytest.raises(RemoteError) as info:
            await client.call("box", "ping")
        assert info.value.code == ErrorCode.DISCONNECTED
        small_demo.launch()
        await wait_for(lambda: view.link == "online", timeout=40)
        assert (await client.call("box", "ping"))["t"] > 0
    finally:
        await client.stop()


async def one_shot(demo, use_openssh: bool, **kwargs) -> FleetClient:
    """A CLI-like client (no stream, no reconnect) over the SSH client asked for; checks it is the one used."""
    client = await connected(demo, subscribe=[], reconnect=False, use_openssh=use_openssh, **kwargs)
    assert set(client.transports.values()) == {"openssh" if use_openssh else "asyncssh"}
    return client


async def test_a_one_shot_client_gets_the_same_lab_over_either_ssh_client(small_demo, use_openssh):
    client = await one_shot(small_demo, use_openssh)
    try:
        view = client.state.machines["box"]
        assert view.link == "online", view.error
        assert view.hello.protocol == PROTOCOL_VERSION and view.hello.role == "operator"
        assert view.gpus[0].name == "Tesla P4" and view.host.ram_total_bytes > 0  # the status snapshot, parsed
        assert (await client.call("box", "ping"))["t"] > 0
        with pytest.raises(RemoteError) as info:
            await client.call("box", "no.such.method")
        assert info.value.code == ErrorCode.METHOD_NOT_FOUND
    finally:
        await client.stop()
    assert view.link == "online" and not _ssh_children()  # stopped: no ssh process left behind


def _ssh_children() -> list[str]:
    import os

    import psutil

    return [p.name() for p in psutil.Process(os.getpid()).children(recursive=True) if p.name() == "ssh"]


async def test_unknown_client_key_is_refused(small_demo, tmp_path, use_openssh):
    stranger = tmp_path / "stranger_key"
    ensure_key(stranger)
    client = await one_shot(small_demo, use_openssh, key_path=stranger)
    try:
        view = client.state.machines["box"]
        assert view.link == "refused"
        assert "refused our key" in view.error and "cetlab-agent authorize" in view.error
    finally:
        await client.stop()


async def test_a_corrupt_console_key_is_named(small_demo, tmp_path, use_openssh):
    broken = tmp_path / "broken_key"
    broken.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")
    broken.chmod(0o600)
    client = await one_shot(small_demo, use_openssh, key_path=broken)
    try:
        view = client.state.machines["box"]
        assert view.link == "refused" and f"cannot use the console key {broken}" in view.error, view.error
    finally:
        await client.stop()


async def test_nobody_listening_reads_offline_with_the_reason(small_demo, use_openssh):
    small_demo.stop()  # the agent is gone; its port refuses
    client = await one_shot(small_demo, use_openssh)
    try:
        view = client.state.machines["box"]
        assert view.link == "offline" and view.error == "connection refused (is the agent running?)", view.error
        with pytest.raises(RemoteError) as info:
            await client.call("box", "ping")
        assert info.value.code == ErrorCode.DISCONNECTED
    finally:
        await client.stop()


async def test_changed_host_key_is_refused(small_demo, tmp_path, use_openssh):
    lab = load_lab(small_demo.lab_path)
    machine = lab.machine("box")
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{machine.port} {impostor.export_public_key().decode()}")
    # trust on first use never covers a changed key (with it, a link keeps to asyncssh, which does the trusting)
    client = await one_shot(small_demo, use_openssh, known_hosts=known_hosts, trust_on_first_use=not use_openssh)
    try:
        view = client.state.machines["box"]
        assert view.link == "untrusted"
        assert "HOST KEY CHANGED" in view.error and str(known_hosts) in view.error
    finally:
        await client.stop()


async def test_unknown_host_needs_trust_on_first_use(small_demo, tmp_path, use_openssh):
    known_hosts = tmp_path / "known_hosts"
    client = await one_shot(small_demo, use_openssh, known_hosts=known_hosts)
    try:
        assert client.state.machines["box"].link == "untrusted"
        assert "unknown host key" in client.state.machines["box"].error
    finally:
        await client.stop()
    client = await connected(small_demo, known_hosts=known_hosts, trust_on_first_use=True, reconnect=False)
    try:
        assert client.state.machines["box"].link == "online"
        assert known_hosts.read_text().startswith("[127.0.0.1]:")
    finally:
        await client.stop()


async def test_viewer_may_look_but_not_act(small_demo, tmp_path):
    viewer_key = tmp_path / "viewer"
    key = ensure_key(viewer_key, comment="alice-laptop")
    authorized = small_demo.dir / "agents" / "box" / AUTHORIZED_KEYS_NAME
    with authorized.open("a") as f:  # the agent re-reads the file: no restart needed
        f.write(f"viewer {key.export_public_key().decode().strip()}\n")
    client = await connected(small_demo, key_path=viewer_key)
    try:
        assert client.state.machines["box"].hello.role == "viewer"
        assert (await client.call("box", "status"))["gpus"]
        with pytest.raises(RemoteError) as info:
            await client.call("box", "set_interval", {"interval_s": 2})
        assert info.value.code == ErrorCode.FORBIDDEN
        assert "operator" in info.value.message
        assert (await client.call("box", "ping"))["t"] > 0  # the connection lives on
    finally:
        await client.stop()


async def test_too_open_authorized_keys_refuses_everyone(small_demo):
    authorized = small_demo.dir / "agents" / "box" / AUTHORIZED_KEYS_NAME
    authorized.chmod(0o666)
    try:
        client = await connected(small_demo, reconnect=False)
        try:
            assert client.state.machines["box"].link == "refused"
        finally:
            await client.stop()
    finally:
        authorized.chmod(0o600)


async def raw_session(demo):
    lab = load_lab(demo.lab_path)
    machine = lab.machine("box")
    conn = await asyncssh.connect(
        machine.host,
        machine.port,
        username="cetlab",
        client_keys=[str(lab.resolve(lab.console.key))],
        known_hosts=str(lab.resolve(lab.console.known_hosts)),
        agent_path=None,
        config=None,
    )
    writer, reader, _ = await conn.open_session(subsystem="cetlab", encoding=None)
    return conn, writer, reader


async def answer(writer, reader, data: bytes) -> dict:
    writer.write(data)
    while True:
        message = json.loads(await within(reader.readline(), 10))
        if "event" not in message:
            return message


async def test_malformed_and_oversized_messages_get_typed_errors(small_demo):
    conn, writer, reader = await raw_session(small_demo)
    try:
        cases = [
            (b"this is not json\n", ErrorCode.PARSE_ERROR),
            (b"\xff\xfe\n", ErrorCode.PARSE_ERROR),
            (b"[1, 2, 3]\n", ErrorCode.INVALID_REQUEST),
            (b'{"id": true, "method": "ping"}\n', ErrorCode.INVALID_REQUEST),
            (b'{"id": 1, "method": 42}\n', ErrorCode.INVALID_REQUEST),
            (b'{"id": 2, "method": "rm -rf /"}\n', ErrorCode.METHOD_NOT_FOUND),
            (b'{"id": 3, "method": "history", "params": {"max_points": "many"}}\n', ErrorCode.INVALID_PARAMS),
            (b'{"id": 4, "method": "history", "params": {"bogus": 1}}\n', ErrorCode.INVALID_PARAMS),
            (b'{"id": 5, "method": "ping", "params": [1]}\n', ErrorCode.INVALID_PARAMS),
            (b"{" + b" " * (MAX_MESSAGE_BYTES + 10) + b"}\n", ErrorCode.TOO_LARGE),
        ]
        for data, code in cases:
            reply = await answer(writer, reader, data)
            assert reply["error"]["code"] == code, (data[:40], reply)
            assert "Traceback" not in reply["error"]["message"]
        reply = await answer(writer, reader, b'{"id": 99, "method": "ping"}\n')
        assert reply["id"] == 99 and reply["result"]["t"] > 0
    finally:
        conn.close()


async def test_no_shell_and_no_exec(small_demo):
    lab = load_lab(small_demo.lab_path)
    machine = lab.machine("box")
    async with asyncssh.connect(
        machine.host,
        machine.port,
        username="cetlab",
        client_keys=[str(lab.resolve(lab.console.key))],
        known_hosts=str(lab.resolve(lab.console.known_hosts)),
        agent_path=None,
        config=None,
    ) as conn:
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.run("id", check=True)


def test_cli_status_json_lists_offline_machines(small_demo, tmp_path):
    import yaml

    data = yaml.safe_load(small_demo.lab_path.read_text())
    ghost = {"name": "ghost", "host": "127.0.0.1", "port": 9, "gpus": "none"}
    data["machines"].append(ghost)
    lab_path = small_demo.dir / "lab-with-ghost.yaml"
    lab_path.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(lab_path), "--json", "--timeout", "10", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    machines = {m["name"]: m for m in status["machines"]}
    assert status["lab"] == "test-lab"
    assert machines["box"]["online"] is True and machines["box"]["simulated"] is True
    gpu = machines["box"]["gpus"][0]
    assert set(gpu) >= {"index", "name", "util_pct", "mem_used_bytes", "mem_total_bytes", "temp_c", "power_w"}
    assert machines["ghost"]["online"] is False
    assert "refused" in machines["ghost"]["error"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client on PATH")
def test_a_console_that_ends_its_input_gets_its_replies_then_the_agent_closes(small_demo):
    """`echo '{...}' | ssh -s cetlab`: the agent answers what was asked, then closes, so ssh exits (and a
    CLI killed mid-verb leaves no ssh behind: its ssh's input ends the same way)."""
    lab = load_lab(small_demo.lab_path)
    machine = lab.machine("box")
    console_dir = small_demo.dir / "console"
    command = openssh.argv(machine.host, machine.port, console_dir / "id_ed25519", console_dir / "known_hosts", 10, 15)
    requests = b'{"id": 1, "method": "hello", "params": {}}\n{"id": 2, "method": "status", "params": {}}\n'
    result = subprocess.run(command, input=requests, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    replies = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2] and replies[1]["result"]["gpus"]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen to write a key with a passphrase")
async def test_a_console_key_with_a_passphrase_is_named_not_blamed_on_the_agent(small_demo, tmp_path, use_openssh):
    """ssh says only "Permission denied" for a key it cannot load: that must not read as a key the agent refused."""
    locked = tmp_path / "locked_key"  # written by ssh-keygen: asyncssh encrypts OpenSSH keys only with bcrypt installed
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True, capture_output=True)
    client = await one_shot(small_demo, use_openssh, key_path=locked)
    try:
        view = client.state.machines["box"]
        assert view.link == "refused" and f"cannot use the console key {locked}" in view.error, view.error
        assert "passphrase" in view.error.lower() and "authorize" not in view.error
    finally:
        await client.stop()
