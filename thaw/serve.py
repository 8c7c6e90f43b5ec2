"""Run one service's ASGI app the way every Thaw service runs: uvicorn, JSON logs, and a
SIGTERM (or Ctrl-C) that drains through the app's lifespan and exits 0."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any


def run_server(app: Any, host: str, port: int, *, graceful_s: float = 10.0, access_log: bool = False,
               on_exit: Callable[[], Coroutine[Any, Any, None]] | None = None, reuse_port: bool = False) -> int:
    """Serve ``app`` until SIGTERM/SIGINT; 0 after a clean shutdown.

    uvicorn turns the signal into a graceful shutdown (the lifespan stops what the app
    started) and afterwards re-raises it under the handlers it found: these make that a
    no-op, so a completed shutdown exits 0 instead of dying by the signal.
    ``reuse_port``: bind with SO_REUSEPORT, so that several processes share the port and
    the kernel spreads new connections across them.
    """
    import uvicorn

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=int(graceful_s))

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Before uvicorn stops taking connections: e.g. the controller stops deciding.
            if on_exit is not None and not self.should_exit:
                asyncio.get_event_loop().create_task(on_exit())
            super().handle_exit(sig, frame)

    server = Server(config)
    server.run(sockets=[reuse_port_socket(host, port)] if reuse_port else None)
    return 0 if server.started else 1


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
