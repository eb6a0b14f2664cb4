"""`cetlab-console --serve` (issue 32 item 11): the console served to a browser, read-only by default, sessions capped.

No browser: the test fetches the page and opens its websocket as the page's JavaScript does (textual-serve's protocol:
JSON text frames in, the console's terminal output as binary frames out), against a real agent and a real server.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from agents.shell.demo.lab import free_ports
from console.tui.serve import check_host
from tests.support.waits import wait_for

ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def _start(lab_path: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "console.tui.app", "--lab", str(lab_path), "--serve", "--port", str(port), *flags]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert process.stdout is not None
    first = process.stdout.readline()
    assert f"http://127.0.0.1:{port}" in first, first
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture
def served(small_demo) -> Iterator[str]:
    """The small lab's console served read-only with one session at most; yields its URL."""
    process, url = _start(small_demo.lab_path, "--max-sessions", "1")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


class Tab:
    """One browser tab: the websocket the page opens, the terminal text it has received so far (escapes removed)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.raw = ws, b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    async def until(self, *words: str) -> None:
        async def arrived() -> bool:
            message = await self.ws.receive(timeout=30)
            if message.type == aiohttp.WSMsgType.BINARY:
                self.raw += message.data
            assert message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), f"websocket closed: {message}"
            return all(word in self.text for word in words)

        try:
            await wait_for(arrived, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{words} not in the tab's text: {self.text[-3000:]!r}") from exc

    async def keys(self, typed: str) -> None:
        for key in typed:
            await self.ws.send_json(["stdin", key])


async def _open_tab(session: aiohttp.ClientSession, url: str) -> Tab:
    async def page_served() -> str | None:
        try:  # the URL is printed as the server starts, a moment before it listens
            return await (await session.get(url)).text()
        except aiohttp.ClientConnectorError:
            return None

    page = await wait_for(page_served)
    ws_url = re.search(r'data-session-websocket-url="([^"]+)"', page)
    assert ws_url, page[:500]
    ws = await session.ws_connect(f"{ws_url.group(1)}?width=120&height=36")
    await ws.send_json(["resize", {"width": 120, "height": 36}])
    return Tab(ws)


async def test_a_served_console_shows_the_fleet_refuses_acting_keys_and_caps_its_sessions(served):
    url = served
    async with aiohttp.ClientSession() as session:
        tab = await _open_tab(session, url)
        await tab.until("box", "Tesla P4", "READ-ONLY")  # the fleet, live from the agent, and the header's mode

        # a second tab over the cap is refused before any console process starts
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{url}/ws")
        assert refused.value.status == 503

        # an acting key does nothing read-only: `n` in the jobs view would look for recipes (and say there are none)
        await tab.keys(":")
        await tab.until("view: fleet")  # the jump box has the keys only once it is up
        await tab.keys("jobs\r")
        await tab.until("Logs")
        await tab.keys("n?")
        await tab.until("this help")
        assert "no recipes" not in tab.text
        assert "New run" not in tab.text
        await tab.ws.close()

        async def a_closed_tab_frees_its_session() -> bool:
            try:
                ws = await session.ws_connect(f"{url}/ws")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 503
                return False
            await ws.close()
            return True

        await wait_for(a_closed_tab_frees_its_session)


async def test_an_operator_console_acts(small_demo):
    """The counterpart: with --operator the same key does act (so the read-only test can fail)."""
    process, url = _start(small_demo.lab_path, "--operator")
    try:
        async with aiohttp.ClientSession() as session:
            tab = await _open_tab(session, url)
            await tab.until("box", "Tesla P4")
            assert "READ-ONLY" not in tab.text
            await tab.keys(":")
            await tab.until("view: fleet")
            await tab.keys("jobs\r")
            await tab.until("New run")
            await tab.keys("n")
            await tab.until("no recipes")
            await tab.ws.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_network_host_needs_saying_so_twice(small_demo):
    """The page has no login: a non-loopback --host without --open-to-network is refused before listening."""
    assert check_host("127.0.0.1", False) is None and check_host("::1", False) is None and check_host("localhost", False) is None
    assert check_host("0.0.0.0", True) is None
    result = subprocess.run(
        [sys.executable, "-m", "console.tui.app", "--lab", str(small_demo.lab_path), "--serve", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--open-to-network" in result.stderr and "no login" in result.stderr
