"""A TCP proxy that delays every byte by a fixed one-way time: a zone's network in front of the shared Redis.

Traffic shaping (``tc netem``) needs privileges these machines do not give; this proxy runs in the test's
event loop instead.  Each direction of each connection is a queue of ``(due, chunk)``: a chunk is written
``delay_ms`` after it was read, in order, so the round trip through the proxy is ``2 * delay_ms`` plus
Redis's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

__all__ = ["DelayProxy"]


class DelayProxy:
    """Listens on 127.0.0.1 (a free port, :attr:`port`) and forwards to ``host:port``, ``delay_ms`` each way."""

    def __init__(self, host: str, port: int, delay_ms: float) -> None:
        self.target = (host, port)
        self.delay_s = delay_ms / 1000.0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        for src, dst in ((reader, up_w), (up_r, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                dst.write(chunk)
                await dst.drain()

        sender = asyncio.create_task(send())
        try:
            while chunk := await src.read(65536):
                queue.put_nowait((time.monotonic() + self.delay_s, chunk))
            queue.put_nowait((0.0, b""))
            await sender
        except (ConnectionError, asyncio.CancelledError):
            sender.cancel()
        finally:
            dst.close()
