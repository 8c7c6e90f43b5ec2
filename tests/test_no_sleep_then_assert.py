"""The suite's rule for time in tests: a test waits on a condition (tests/waiting.py) or
an injected clock, never sleeps and then asserts what it hopes has happened by then.

The one exception is a quiet period: a check that something does *not* happen, which
only time can show. Its sleep says so on its line (``# quiet: ...``)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_sleep(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Expr):
        return False
    call = stmt.value.value if isinstance(stmt.value, ast.Await) else stmt.value
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr == "sleep" and isinstance(f.value, ast.Name) and f.value.id in ("time", "asyncio")
    return isinstance(f, ast.Name) and f.id == "sleep"


def sleeps_then_asserts(source: str) -> list[int]:
    """Lines of sleeps directly followed by an assert, unless marked ``# quiet:``."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        for field in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for a, b in zip(stmts, stmts[1:], strict=False):
                if isinstance(a, ast.stmt) and _is_sleep(a) and isinstance(b, ast.Assert) \
                        and "# quiet:" not in lines[a.lineno - 1]:
                    out.append(a.lineno)
    return sorted(out)


def test_the_rule_finds_what_it_should() -> None:
    bad = "import time\ndef test():\n    time.sleep(0.1)\n    assert x\n"
    awaited = "import asyncio\nasync def test():\n    await asyncio.sleep(0.1)\n    assert x\n"
    quiet = "import time\ndef test():\n    time.sleep(0.1)  # quiet: nothing restarts\n    assert x\n"
    polling = "import time\ndef test():\n    while not x:\n        assert t < 5\n        time.sleep(0.1)\n"
    assert sleeps_then_asserts(bad) == [3] and sleeps_then_asserts(awaited) == [3]
    assert sleeps_then_asserts(quiet) == [] and sleeps_then_asserts(polling) == []


def test_no_test_sleeps_then_asserts() -> None:
    found = {str(p.relative_to(TESTS)): lines for p in sorted(TESTS.rglob("*.py"))
             if (lines := sleeps_then_asserts(p.read_text()))}
    assert found == {}, "wait on a condition (tests/waiting.py), or mark a quiet period '# quiet: why'"
