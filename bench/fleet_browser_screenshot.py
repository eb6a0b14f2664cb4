"""A screenshot of the served console in headless Chromium, driven over the DevTools protocol (issue 32 item 11).

Chromium's --screenshot flag cannot wait for a websocket's data (virtual time runs out at once), so this opens the
page, waits until the console's first bytes arrived (textual-serve's page marks its body `-first-byte`), lets the
console draw for SETTLE_S, and captures the page. Run by bench/fleet_browser_screenshot.sh.
    python bench/fleet_browser_screenshot.py CHROMIUM URL OUT.png WIDTH HEIGHT
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

SETTLE_S = 6.0  # after the first bytes: the console connects to the agents and draws its fleet (a real screen, a real wait)


async def shoot(browser: str, url: str, out: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        chrome = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--hide-scrollbars", "--enable-unsafe-swiftshader",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text().strip():
                if time.monotonic() > deadline or chrome.poll() is not None:
                    raise SystemExit("Chromium did not start its DevTools endpoint")
                await asyncio.sleep(0.1)
            port = port_file.read_text().split()[0]
            async with aiohttp.ClientSession() as http:
                targets = await (await http.get(f"http://127.0.0.1:{port}/json")).json()
                page = next(t for t in targets if t["type"] == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    ids = itertools.count(1)

                    async def call(method: str, **params: Any) -> dict[str, Any]:
                        n = next(ids)
                        await ws.send_json({"id": n, "method": method, "params": params})
                        while True:
                            message = json.loads((await ws.receive()).data)
                            if message.get("id") == n:
                                return dict(message.get("result", {}))

                    await call("Page.enable")
                    await call("Page.navigate", url=url)
                    probe = "document.body !== null && document.body.classList.contains('-first-byte')"
                    deadline = time.monotonic() + 90
                    while not (await call("Runtime.evaluate", expression=probe))["result"].get("value"):
                        if time.monotonic() > deadline:
                            raise SystemExit(f"no console output reached the page at {url}")
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(SETTLE_S)
                    shot = await call("Page.captureScreenshot", format="png")
                    out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            chrome.terminate()
            chrome.wait(timeout=30)


def main() -> int:
    browser, url, out, width, height = sys.argv[1:6]
    asyncio.run(shoot(browser, url, Path(out), int(width), int(height)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
