"""A TCP proxy that can add one-way latency: a slow network link between a client and the gateway.

Bytes are relayed unchanged (TLS passes straight through), in order, each chunk delivered
``delay`` seconds after it arrived, in both directions, so a request/response round trip gains
twice the delay. The delay starts at 0; ``SIGUSR1`` switches it to ``--delay-ms`` (the incident).

    python -m hopline.demo.delay_proxy --target 127.0.0.1:8443 --delay-ms 60 --port-file p.port
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from pathlib import Path


class DelayProxy:
    def __init__(self, target_host: str, target_port: int, delay_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, holding each chunk until ``delay_s`` after its arrival."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        delivery = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.delay_s, data))
            queue.put_nowait((0.0, b""))
            await delivery
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()
        except (ConnectionError, OSError):
            pass
        finally:
            delivery.cancel()

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(
                self._pipe(client_reader, upstream_writer),
                self._pipe(upstream_reader, client_writer),
            )
        finally:
            for writer in (client_writer, upstream_writer):
                with contextlib.suppress(Exception):
                    writer.close()


async def _serve(proxy: DelayProxy, port_file: Path, incident_delay_s: float) -> None:
    from hopline.demo.process import announce_port, listening_socket

    sock = listening_socket()
    server = await asyncio.start_server(proxy.handle, sock=sock)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(proxy, "delay_s", incident_delay_s))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    announce_port(port_file, sock.getsockname()[1])
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    from hopline.demo.process import watch_parent

    parser = argparse.ArgumentParser(description="TCP proxy adding one-way latency after SIGUSR1.")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay once SIGUSR1 arrives")
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args(argv)
    watch_parent()
    host, port = args.target.rsplit(":", 1)
    asyncio.run(_serve(DelayProxy(host, int(port)), args.port_file, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
