"""The delay proxy relays bytes unchanged, and after the incident holds each chunk for the delay."""

from __future__ import annotations

import asyncio
import time

from hopline.demo.delay_proxy import DelayProxy


async def _round_trips(delay_s: float) -> tuple[list[bytes], float]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = DelayProxy("127.0.0.1", upstream.sockets[0].getsockname()[1])
    front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    answers = []
    for word in (b"before", b"after"):
        if word == b"after":
            proxy.delay_s = delay_s  # what SIGUSR1 does
        started = time.monotonic()
        writer.write(word)
        await writer.drain()
        answers.append(await reader.readexactly(len(word)))
        elapsed = time.monotonic() - started
    writer.close()
    front.close()
    upstream.close()
    return answers, elapsed


def test_bytes_pass_unchanged_and_the_delay_applies_both_ways() -> None:
    answers, after = asyncio.run(_round_trips(0.1))
    assert answers == [b"BEFORE", b"AFTER"]
    # one round trip crosses the proxy twice: at least 2 x 100 ms once the delay is on
    assert after >= 0.2 - 0.005
