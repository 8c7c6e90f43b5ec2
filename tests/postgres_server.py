"""A real PostgreSQL for tests (loadtests/postgres.py, which the benchmarks share).
Without the binaries, or when it cannot start, the test fails (it does not skip)."""

from __future__ import annotations

import pytest

from loadtests import postgres
from loadtests.postgres import MISSING, PostgresUnavailable

__all__ = ["MISSING", "PostgresServer"]


class PostgresServer(postgres.PostgresServer):
    """:class:`loadtests.postgres.PostgresServer`, its failures a failed test with the reason."""

    def __init__(self) -> None:
        try:
            super().__init__()
        except PostgresUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)

    def _run(self, *argv: str) -> None:
        try:
            super()._run(*argv)
        except PostgresUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)

    def start(self) -> None:
        try:
            super().start()
        except PostgresUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
