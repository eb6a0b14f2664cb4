"""Faults on purpose: kill -9 with a trainer and a model server running, a frozen agent, a cut socket, a lost GPU."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from pathlib import Path

import psutil
import pytest
import yaml

from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.engine_address import EngineAddress
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.agent_process import P4, PY, SLEEPER, connected
from tests.support.lab import kill_jobs_left
from tests.support.pool import engine_http
from tests.support.waits import wait_for

FAST_SIM = {"load_s": 0.3, "cold_factor": 1, "warmup_s": 0.2, "wake_s": 0.1, "tokens_per_s": 500, "placeholder_mib": 1}


def sim_servers(socket: str) -> list[psutil.Process]:
    """The sim model server processes listening on this socket (by their command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "agents.orchestra.engines.vllm.twin" in cmd and socket in cmd:
            found.append(proc)
    return found


def complete(endpoint: str, model: str) -> dict:
    status, raw = engine_http(
        endpoint.removesuffix("/v1") + "/v1/completions", {"model": model, "prompt": "still serving?", "max_tokens": 3}
    )
    assert status == 200, raw
    return json.loads(raw)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("state_db", ["kept", "lost"])
async def test_kill_9_then_restart_readopts_trainer_and_model_server(tmp_path, state_db):
    """kill -9, restart: the trainer and the model server are serving again, the same processes. With state.db
    lost as well (deleted; a corrupt one is moved aside the same way), both are found again from their folders."""
    source = tmp_path / "lab.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "lab": "hardening",
                "machines": [{"name": "box", "gpus": {"sim": [P4, P4]}}],
                "trainers": [
                    {
                        "name": "steady",
                        "machine": "box",
                        "gpus": [0],
                        "command": [PY, "-c", SLEEPER],
                        "output_dir": "runs/{job_id}",
                    }
                ],
                "models": [
                    {
                        "name": "m",
                        "path": "models/m",
                        "engine": "sim",
                        "machine": "box",
                        "gpus": [1],
                        "vram_gib": 4,
                        "sim": FAST_SIM,
                    }
                ],
                "orchestra": {"warm": ["m"]},
            }
        )
    )
    demo = DemoLab(tmp_path / "run", source=source)
    demo.start()
    client = None
    try:
        demo.wait_listening()
        client = await connected(demo.lab_path)
        job = await client.call("box", "jobs.start", {"recipe": "steady"})

        async def states(via=None) -> tuple[dict, dict]:
            via = via or client
            jobs = await via.call("box", "jobs.list")
            models = (await via.call("box", "models.list"))["models"]
            return next(j for j in jobs if j["id"] == job["id"]), next(m for m in models if m["name"] == "m")

        async def both_up() -> bool:
            j, m = await states()
            return j["state"] == "running" and m["state"] == "warm"

        await wait_for(both_up, timeout=60, interval=0.1)
        before_job, before_model = await states()
        assert before_job["state"] == "running" and before_model["state"] == "warm", (before_job, before_model)
        endpoint = before_model["endpoint"]
        port = EngineAddress.parse(endpoint).socket
        assert port is not None
        [server] = sim_servers(port)
        trainer = psutil.Process(before_job["pid"])
        audit_before = (await client.call("box", "audit.list"))["total"]
        assert audit_before >= 1  # jobs.start

        agent = demo.processes[0]
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        demo.processes.clear()
        # the point, not a wait: no agent for longer than the sim server's check of its agent (it must wait to be
        # re-adopted, not leave); nothing to wait on, the server stays as it is
        await asyncio.sleep(2.5)
        assert trainer.is_running() and server.is_running()
        db = sqlite3.connect(demo.dir / "agents" / "box" / "state.db")  # WAL + transactions: intact after kill -9
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.close()
        if state_db == "lost":
            for path in (demo.dir / "agents" / "box").glob("state.db*"):
                path.unlink()

        started = time.monotonic()
        demo.launch()
        await asyncio.to_thread(demo.wait_listening)
        fresh = await connected(demo.lab_path)  # a console that connects as soon as the agent listens
        try:
            j, m = await states(fresh)
        finally:
            await fresh.stop()
        readopted_s = time.monotonic() - started
        assert j["state"] == "running" and j["adopted"] and m["state"] == "warm", (j, m)
        view = client.state.machines["box"]
        await wait_for(lambda: view.online, timeout=60)  # the first console reconnects by itself (with backoff)
        print(
            f"\nre-adoption after kill -9: trainer and model server serving again {readopted_s:.2f} s after the agent's restart;"
            f" the console that saw the crash was back after {time.monotonic() - started:.2f} s"
        )
        j, m = await states()
        assert j["pid"] == trainer.pid and m["endpoint"] == endpoint  # the same processes, not new ones
        assert sim_servers(port) == [server]
        assert complete(endpoint, "m")["usage"]["completion_tokens"] == 3
        # the engine's temp, IPC and metrics folders are its own, under the state dir: a kept engine keeps them when
        # the agent (and systemd's PrivateTmp with it) goes, and the restarted agent reads its metrics
        env = server.environ()
        for name in ("TMPDIR", "VLLM_RPC_BASE_PATH", "PROMETHEUS_MULTIPROC_DIR"):
            assert Path(env[name]).is_relative_to(demo.dir / "agents" / "box") and Path(env[name]).is_dir(), name

        async def metrics_read() -> bool:
            return (await client.call("box", "models.get", {"model": "m"})).get("generation_tokens_total") is not None

        await wait_for(metrics_read, timeout=30)
        log_lines = (await client.call("box", "jobs.logs", {"id": job["id"], "tail_lines": 2}))["lines"]
        step = int(log_lines[-1].split()[1])

        async def followed() -> bool:  # its log is still followed: a later step comes
            lines = (await client.call("box", "jobs.logs", {"id": job["id"], "tail_lines": 1}))["lines"]
            return int(lines[-1].split()[1]) > step

        await wait_for(followed, timeout=30)
        history = (await client.call("box", "models.get", {"model": "m"}))["history"]
        assert any(h["event"] == "adopt" for h in history)
        server.kill()  # a re-adopted engine that dies: how it ended went to init, and the model says so (never "code -1")

        async def failed_model() -> dict | None:
            m = (await states())[1]
            return m if m["state"] == "failed" else None

        gone = await wait_for(failed_model, timeout=30)
        assert "re-adopted after an agent restart" in gone["error"]["message"] and "-1" not in gone["error"]["message"], gone[
            "error"
        ]
        if state_db == "kept":
            assert (await client.call("box", "audit.list"))["total"] >= audit_before  # nothing lost
        await client.call("box", "jobs.kill", {"id": job["id"]})
        if state_db == "lost":  # a new job counts past the folders of the found ones: no id is used twice

            async def ended() -> bool:
                return (await client.call("box", "jobs.get", {"id": job["id"]}))["state"] not in (
                    "running",
                    "stopping",
                    "starting",
                )

            await wait_for(ended, timeout=30)
            again = await client.call("box", "jobs.start", {"recipe": "steady"})
            assert again["id"] != job["id"]
            await client.call("box", "jobs.kill", {"id": again["id"]})
    finally:
        if client is not None:
            await client.stop()
        demo.stop()  # SIGTERM without --keep-engines: the agent stops its model servers
        kill_jobs_left(demo.dir)  # a failure half-way leaves no trainer behind
    await wait_for(lambda: not server.is_running(), timeout=20)


@pytest.mark.timeout(120)
async def test_frozen_agent_shows_offline_then_recovers_by_itself(small_demo):
    client = await connected(small_demo.lab_path)
    view = client.state.machines["box"]
    agent = psutil.Process(small_demo.processes[0].pid)
    try:
        assert view.online
        await wait_for(lambda: view.sample_t, timeout=10)
        stopped = time.monotonic()
        agent.suspend()  # SIGSTOP: the TCP connection stays open, nothing answers
        try:
            await wait_for(lambda: view.link == "offline", timeout=40)
            offline_s = time.monotonic() - stopped
            # one moving figure on the card ("last seen 14s ago"), not a second frozen one beside it ("no data for 11 s")
            assert "no data for" not in (view.error or "") and "went silent: no data within" in (view.error or ""), view.error
            with pytest.raises(RemoteError) as info:  # the caller is told, never left hanging
                await within(client.call("box", "ping", timeout=2), 30)
            assert info.value.code in (ErrorCode.DISCONNECTED, ErrorCode.TIMEOUT)
            await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - stopped)))  # the point: frozen for 10 s in all
        finally:
            agent.resume()
        resumed = time.monotonic()
        await wait_for(lambda: view.link == "online", timeout=60)
        recovered_s = time.monotonic() - resumed
        print(f"\nSIGSTOP 10 s: offline after {offline_s:.1f} s, online again {recovered_s:.1f} s after SIGCONT")
        assert (await client.call("box", "ping"))["t"] > 0
        first = view.sample_t
        await wait_for(lambda: view.sample_t > first, timeout=10)  # the stream flows again

        cut = time.monotonic()
        client.links["box"].conn.abort()  # the socket closes under the client
        await wait_for(lambda: view.link != "online", timeout=10)
        await wait_for(lambda: view.link == "online", timeout=30)
        print(f"socket cut under the client: online again in {time.monotonic() - cut:.1f} s")
    finally:
        if agent.status() == psutil.STATUS_STOPPED:
            agent.resume()
        await client.stop()
