"""Regenerate screenshots/*.svg from the live demo lab: every view, as a newcomer sees it."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.views import VIEWS

OUT = Path(__file__).resolve().parent
SIZE = (160, 48)


async def shoot(lab_path: Path) -> list[Path]:
    written = []
    app = CetlabApp(load_lab(lab_path))
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 60
        while not all(v.online for v in app.state.machines.values()) and time.monotonic() < deadline:
            await pilot.pause(0.2)
        await pilot.pause(4)  # a few seconds of history for the sparklines

        def save(name: str) -> None:
            path = OUT / f"{name}.svg"
            app.save_screenshot(filename=path.name, path=str(OUT))
            written.append(path)

        save("fleet")
        await pilot.press("enter")
        await pilot.pause(1.5)
        save("machine")
        await pilot.press("escape", "question_mark")
        await pilot.pause(0.5)
        save("help")
        await pilot.press("escape")
        # a real run of the demo recipe, so the jobs and checkpoints views have something to show
        await app.client.call("m5", "jobs.start", {"recipe": "demo-lora", "params": {"max_steps": 2000, "save_steps": 200}})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any((job.step or 0) >= 600 for job in app.state.machines["m5"].jobs):
            await pilot.pause(0.5)
        for name in VIEWS:
            if name == "fleet":
                continue
            await app.switch_mode(name)
            await pilot.pause(2)
            save(name)
    return written


def main() -> None:
    with DemoLab(Path(tempfile.mkdtemp(prefix="cetlab-shots-"))) as demo:
        for path in asyncio.run(shoot(demo.lab_path)):
            print(f"wrote {path.relative_to(OUT.parent)}")


if __name__ == "__main__":
    main()
