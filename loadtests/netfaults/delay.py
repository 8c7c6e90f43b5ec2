"""A TCP proxy that delays what it forwards: the slow links of tests/netfaults (this
kernel has no ``netem``).

    python -m loadtests.netfaults.delay LISTEN_PORT TARGET_HOST TARGET_PORT

It listens on every address of its host (run it in a namespace with ``Net.popen``),
forwards each connection to the target, and holds every chunk of bytes, each way, for
the current delay before sending it on, in order. It prints ``listening`` once ready.
Commands on its standard input, one a line, change the delay for what arrives after:

- ``delay S``: hold each chunk ``S`` seconds (0: none);
- ``quit``: stop.

A delay spike is ``delay 0.2`` then, later, ``delay 0.001``. Order is kept within a
connection: a chunk is never sent before one that arrived earlier, so a lower delay
takes effect as the held chunks drain.
"""

from __future__ import annotations

import asyncio
import sys
import time


class Delay:
    def __init__(self) -> None:
        self.s = 0.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await held.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # not a poll: the chunk is held for the link's delay
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            held.put_nowait((time.monotonic() + delay.s, data))
            if not data:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
        writer.close()


async def _serve(listen_port: int, host: str, port: int) -> None:
    delay = Delay()

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            treader, twriter = await asyncio.open_connection(host, port)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(_pipe(creader, twriter, delay), _pipe(treader, cwriter, delay))

    server = await asyncio.start_server(handle, "0.0.0.0", listen_port)
    print("listening", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    async with server:
        while True:
            line = (await stdin.readline()).decode().split()
            if not line or line[0] == "quit":
                return
            if line[0] == "delay" and len(line) == 2:
                delay.s = max(0.0, float(line[1]))
                print(f"delay {delay.s}", flush=True)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
