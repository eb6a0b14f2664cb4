"""A provider the hardening tests control: a real aiohttp server on loopback speaking OpenAI's chat completions, whose
behaviour is picked by the upstream model name (honest, slow, endless, huge), and which counts what it was asked and
which clients left."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from agents.shell.demo.lab import free_ports

TOKEN_EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "w "}, "finish_reason": null}]}\n\n'


@dataclass
class Upstream:
    """The stand-in provider; `url` ends in /v1."""

    port: int = field(default_factory=lambda: free_ports(1)[0])
    asked: list[dict] = field(default_factory=list)  # every body it got
    produced: int = 0  # completion tokens it sent (streams) or answered (JSON)
    left: int = 0  # requests whose client closed the connection before the end
    in_flight: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.asked.append(body)
        model = body["model"]
        # the most any engine reads: the larger of OpenAI's two length fields (2,001 when none), for every choice
        lengths = [body.get(f) for f in ("max_tokens", "max_completion_tokens") if isinstance(body.get(f), int)]
        n = max(lengths or [2001]) * max(body.get("n") or 1, body.get("best_of") or 1)
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        self.in_flight += 1
        try:
            if model == "huge":  # a 40 MB JSON answer
                return web.Response(body=b'{"pad": "' + b"x" * (40 * 1024 * 1024) + b'"}', content_type="application/json")
            if model == "slow":  # thinks for a minute, unless its client leaves
                await asyncio.sleep(60)
            if not body.get("stream"):
                self.produced += n
                return web.json_response(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "model": model,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": "w " * n}, "finish_reason": "length"}
                        ],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
                    }
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            if model == "endless":  # one event that never ends: 64 KB chunks with no blank line
                for _ in range(2000):
                    await response.write(b"data: " + b"x" * 65536)
                return response
            for i in range(n):
                await response.write(TOKEN_EVENT)
                self.produced += 1
                if i % 50 == 49:
                    await asyncio.sleep(0.01)  # an engine's pace, not a wait: a client may leave mid-stream
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.left += 1
            raise
        finally:
            self.in_flight -= 1
