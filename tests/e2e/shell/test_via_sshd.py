"""`via: sshd`: the agent's unix socket (roles by SO_PEERCRED) and the console through a real sshd with ~/.ssh/config."""

from __future__ import annotations

import getpass
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from agents.runtime.keys import ensure_key
from agents.shell.demo.lab import free_ports
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.agent_process import P4, connected, start_agent, wait_listening
from tests.support.waits import wait_for, wait_until

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def socket_lab(tmp_path: Path, name: str = "lab.yaml", **machine) -> Path:
    path = tmp_path / name
    data = {
        "lab": "hardening",
        "machines": [{"name": "box", "host": "127.0.0.1", "port": free_ports(1)[0], "gpus": {"sim": [P4]}, **machine}],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_for_path(path: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    def appeared() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode()
        return path.exists()

    wait_until(appeared, timeout, what=f"{path} to appear")


def ask(sock_path: Path, *requests: dict) -> list[dict]:
    """Blocking: send JSON lines over the unix socket, read one reply line per request (or until it closes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        try:
            s.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        except BrokenPipeError:  # refused at the door: the agent's answer is already waiting to be read
            pass
        data = b""
        replies: list[dict] = []
        while len(replies) < len(requests):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            *lines, data = data.split(b"\n")
            replies += [m for m in map(json.loads, lines) if "event" not in m]
        return replies


@pytest.fixture
def socket_agent(tmp_path):
    """An agent with its socket in a folder of its own under /tmp (pytest's tmp_path is closed to other users)."""
    lab_path = socket_lab(tmp_path)
    state = tmp_path / "state"
    folder = Path(tempfile.mkdtemp(prefix="cetlab-sock-"))
    proc = start_agent(lab_path, state, "--unix-socket", str(folder / "agent.sock"))
    try:
        wait_for_path(folder / "agent.sock", proc)
        yield folder / "agent.sock", state
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(folder, ignore_errors=True)


def test_own_user_is_an_operator_on_the_unix_socket(socket_agent):
    sock_path, _state = socket_agent
    assert stat.S_IMODE(sock_path.stat().st_mode) == 0o660
    hello, ping, interval = ask(
        sock_path,
        {"id": 1, "method": "hello"},
        {"id": 2, "method": "ping"},
        {"id": 3, "method": "set_interval", "params": {"interval_s": 1}},
    )
    assert hello["result"]["role"] == "operator" and hello["result"]["machine"] == "box"
    assert ping["result"]["t"] > 0 and interval["result"] == {"interval_s": 1.0}
    [bad] = ask(sock_path, {"id": 4, "method": "nope"})
    assert bad["error"]["code"] == ErrorCode.METHOD_NOT_FOUND  # the same typed errors as over SSH


def _as_user(uid: int, gid: int, sock_path: Path, requests: list[dict]) -> list[dict] | str:
    """Connect from a forked child running as another user; its SO_PEERCRED is that uid."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no threads used
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps(ask(sock_path, *requests))
        except BaseException as exc:
            out = json.dumps(f"{type(exc).__name__}: {exc}")
        os.write(write_fd, out.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="connecting as another uid needs root (the test forks a child that drops to nobody)"
)
def test_other_users_need_a_role_in_socket_roles(socket_agent):
    sock_path, state = socket_agent
    nobody = pwd.getpwnam("nobody")
    os.chown(sock_path.parent, -1, nobody.pw_gid)  # the deployment's shared group (e.g. cetlab), here nobody's
    sock_path.parent.chmod(0o750)
    os.chown(sock_path, -1, nobody.pw_gid)
    hello = {"id": 1, "method": "hello"}
    refused = _as_user(nobody.pw_uid, nobody.pw_gid, sock_path, [hello])
    assert isinstance(refused, list) and refused[0]["error"]["code"] == ErrorCode.FORBIDDEN, refused
    assert "'viewer nobody'" in refused[0]["error"]["message"] and str(state / "socket_roles") in refused[0]["error"]["message"]
    (state / "socket_roles").write_text("# who may use the socket\nviewer nobody\n")
    (state / "socket_roles").chmod(0o600)
    hello_reply, action = _as_user(
        nobody.pw_uid, nobody.pw_gid, sock_path, [hello, {"id": 2, "method": "set_interval", "params": {"interval_s": 2}}]
    )
    assert hello_reply["result"]["role"] == "viewer"
    assert action["error"]["code"] == ErrorCode.FORBIDDEN
    (state / "socket_roles").write_text("viewer nobody\nsuperuser root\n")  # a typo refuses everyone but the agent's own user
    [broken] = _as_user(nobody.pw_uid, nobody.pw_gid, sock_path, [hello])
    assert broken["error"]["code"] == ErrorCode.FORBIDDEN and "socket_roles:2" in broken["error"]["message"]


# ---------------------------------------------------------------------------- end to end through a real sshd


@pytest.fixture
def sshd(tmp_path):
    """An sshd of our own on a loopback port: its own host key and authorized keys; the user's ~/.ssh in tmp."""
    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed (apt-get install openssh-server); .ci/run installs it")
    base = tmp_path / "sshd"
    base.mkdir()
    host_key = ensure_key(base / "ssh_host_ed25519_key")
    home = tmp_path / "home"
    user_key = ensure_key(home / ".ssh" / "id_ed25519", comment="alice@laptop")
    (base / "authorized_keys").write_text(user_key.export_public_key().decode())
    port = free_ports(1)[0]
    (base / "sshd_config").write_text(f"""ListenAddress 127.0.0.1
HostKey {base / "ssh_host_ed25519_key"}
PidFile {base / "sshd.pid"}
AuthorizedKeysFile {base / "authorized_keys"}
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
AllowStreamLocalForwarding yes
AllowTcpForwarding yes
""")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(base / "sshd_config"), "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_listening("127.0.0.1", port, timeout=20)
    except RuntimeError:
        proc.kill()
        raise RuntimeError(f"sshd did not start: {proc.stdout.read().decode()[-2000:]}") from None
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode()}")
    # an ordinary ~/.ssh/config: an alias, the jump host, the key, the user
    (home / ".ssh" / "config").write_text(f"""Host labjump
    HostName 127.0.0.1
    Port {port}
    User {getpass.getuser()}
    IdentityFile {home / ".ssh" / "id_ed25519"}

Host labbox
    HostName 127.0.0.1
    Port {port}
    User {getpass.getuser()}
    IdentityFile {home / ".ssh" / "id_ed25519"}
    ProxyJump labjump
""")
    yield home
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.timeout(90)
async def test_console_reaches_the_agent_through_sshd_and_proxyjump(tmp_path, sshd, monkeypatch):
    monkeypatch.setenv("HOME", str(sshd))  # the console uses the user's ~/.ssh: config, key, known_hosts
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    sock_path = tmp_path / "agent.sock"
    lab_path = socket_lab(tmp_path, via="sshd", host="labbox", socket=str(sock_path))
    agent = start_agent(lab_path, tmp_path / "state", "--unix-socket", str(sock_path))
    try:
        wait_for_path(sock_path, agent)
        client = await connected(lab_path)
        try:
            view = client.state.machines["box"]
            assert view.link == "online", view.error
            assert view.hello.role == "operator" and view.hello.machine == "box"
            first = await wait_for(lambda: view.sample_t)
            await wait_for(lambda: view.sample_t > first)  # the tick stream flows through sshd
            assert (await client.call("box", "set_interval", {"interval_s": 1}))["interval_s"] == 1.0
            trail = await client.call("box", "audit.list", {"limit": 1})
            assert trail["entries"][0]["who"] == f"{getpass.getuser()} (unix socket)"  # who logged in to sshd
            with pytest.raises(RemoteError) as info:
                await client.call("box", "history", {"max_points": "lots"})
            assert info.value.code == ErrorCode.INVALID_PARAMS
        finally:
            await client.stop()
        wrong = socket_lab(tmp_path, "wrong.yaml", via="sshd", host="labbox", socket=str(tmp_path / "nowhere.sock"))
        client = await connected(wrong, reconnect=False)
        try:
            view = client.state.machines["box"]
            assert view.link == "offline" and "cannot open the agent's socket" in view.error and "nowhere.sock" in view.error
        finally:
            await client.stop()
    finally:
        agent.terminate()
        agent.wait(timeout=20)
