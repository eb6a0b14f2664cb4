"""A screenshot of the served console in headless Chromium, driven over the DevTools protocol (issue 32 item 11).

Chromium's --screenshot flag cannot wait for a websocket's data (virtual time runs out at once), so this opens the
page with a listener on its websocket, waits until the console's output shows SHOWN (a JavaScript regular expression,
by default the fleet's header once every machine is online: "4/4 machines online"), lets the terminal paint what it
received (two animation frames), and captures the page. Run by bench/fleet_browser_screenshot.sh.
    python bench/fleet_browser_screenshot.py CHROMIUM URL OUT.png WIDTH HEIGHT [SHOWN]
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

SHOWN = r"\b(\d+)/\1 machines online"  # the fleet's header once the console reached every machine and drew its fleet
# Before the page's own scripts run: keep the text the terminal receives (escape sequences taken out), for the probe
LISTEN = """
(() => {
  const Native = window.WebSocket, decoder = new TextDecoder();
  window.__shown = "";
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        if (event.data instanceof ArrayBuffer) {
          const text = window.__shown + decoder.decode(event.data, {stream: true});
          window.__shown = text.replace(/\\x1b\\[[0-9;?]*[ -\\/]*[@-~]/g, "").slice(-1000000);
        }
      });
    }
  };
})();
"""
PAINTED = "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"


async def shoot(browser: str, url: str, out: Path, width: int, height: int, shown: str = SHOWN) -> None:
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
                    await call("Page.addScriptToEvaluateOnNewDocument", source=LISTEN)
                    await call("Page.navigate", url=url)
                    probe = f"new RegExp({json.dumps(shown)}).test(window.__shown || '')"
                    deadline = time.monotonic() + 90
                    while not (await call("Runtime.evaluate", expression=probe))["result"].get("value"):
                        if time.monotonic() > deadline:
                            raise SystemExit(f"the console at {url} never showed {shown!r}")
                        await asyncio.sleep(0.2)  # the probe's pace: the condition is the text shown
                    await call("Runtime.evaluate", expression=PAINTED, awaitPromise=True)
                    shot = await call("Page.captureScreenshot", format="png")
                    out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            chrome.terminate()
            chrome.wait(timeout=30)


def main() -> int:
    browser, url, out, width, height = sys.argv[1:6]
    shown = sys.argv[6] if len(sys.argv) > 6 else SHOWN
    asyncio.run(shoot(browser, url, Path(out), int(width), int(height), shown))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
