"""structlog JSON logging, configured once per process.

Every line carries ``component`` (which part of Thaw wrote it) and, inside a
request, ``request_id`` — bound with :func:`bind_request` through contextvars so
that everything logged while serving that request carries it, across awaits.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class _Stderr:
    """Writes to the ``sys.stderr`` of the moment, not the one logging was set up with:
    whoever replaces it later (a test harness capturing output, a daemon redirecting it)
    must not leave the loggers writing to a closed file, which would raise in the code
    that logs."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def setup_logging(component: str, level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog and the stdlib root logger to write JSON lines.

    Safe to call again (e.g. a CLI subcommand that changes the level); the last call wins.
    """
    lvl = _LEVELS[level]
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream or _Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # Libraries (uvicorn, botocore) log through the stdlib: render them as JSON too.
    handler = logging.StreamHandler(stream or _Stderr())  # type: ignore[arg-type]
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.JSONRenderer()],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3", "aiobotocore", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(component=component)


def get_logger(**initial: Any) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(**initial)  # type: ignore[no-any-return]


@contextmanager
def bind_request(request_id: str, **extra: Any) -> Iterator[None]:
    """Bind ``request_id`` (and ``extra``) to every log line in this context."""
    tokens = structlog.contextvars.bind_contextvars(request_id=request_id, **extra)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
