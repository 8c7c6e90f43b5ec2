"""The suite's rule for time in tests: a test waits on a condition (tests/waiting.py) or
an injected clock, never sleeps and then asserts what it hopes has happened by then.

The one exception is a quiet period: a check that something does *not* happen, which
only time can show. Its sleep says so on its line (``# quiet: ...``).

Nor does a test write its own poll loop (a loop that sleeps between checks): it calls
``until`` / ``wait_until``, which fail naming what was awaited. A loop that sleeps for
another reason (a fake's pace or stall, a load generator, turns of the event loop)
says so on the sleep's line (``# not a poll: ...``)."""

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


_LOOPS = (ast.While, ast.For, ast.AsyncFor)
_SCOPES = (*_LOOPS, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _own_sleeps(loop: ast.AST) -> list[ast.stmt]:
    """The sleep statements of ``loop`` itself (not of a loop or function inside it)."""
    out: list[ast.stmt] = []
    for child in ast.iter_child_nodes(loop):
        if isinstance(child, ast.stmt) and _is_sleep(child):
            out.append(child)
        elif not isinstance(child, _SCOPES):
            out.extend(_own_sleeps(child))
    return out


def polls_by_hand(source: str) -> list[int]:
    """Lines of loops that sleep, unless each of their sleeps is marked ``# not a poll:``."""
    lines = source.splitlines()
    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, _LOOPS)
                  and any("# not a poll:" not in lines[s.lineno - 1] for s in _own_sleeps(node)))


def test_the_rule_finds_what_it_should() -> None:
    bad = "import time\ndef test():\n    time.sleep(0.1)\n    assert x\n"
    awaited = "import asyncio\nasync def test():\n    await asyncio.sleep(0.1)\n    assert x\n"
    quiet = "import time\ndef test():\n    time.sleep(0.1)  # quiet: nothing restarts\n    assert x\n"
    polling = "import time\ndef test():\n    while not x:\n        assert t < 5\n        time.sleep(0.1)\n"
    assert sleeps_then_asserts(bad) == [3] and sleeps_then_asserts(awaited) == [3]
    assert sleeps_then_asserts(quiet) == [] and sleeps_then_asserts(polling) == []
    assert polls_by_hand(polling) == [3]
    awaited_poll = ("import asyncio\nasync def f():\n    for _ in range(9):\n        if x:\n            break\n"
                    "        try:\n            await asyncio.sleep(0.01)\n        finally:\n            pass\n")
    paced = "import time\ndef f():\n    while True:\n        time.sleep(1)  # not a poll: the load's pace\n"
    inner = "import time\ndef f():\n    for a in b:\n        def g():\n            time.sleep(1)\n"
    assert polls_by_hand(awaited_poll) == [3] and polls_by_hand(paced) == [] and polls_by_hand(inner) == []


def test_no_test_sleeps_then_asserts() -> None:
    found = {str(p.relative_to(TESTS)): lines for p in sorted(TESTS.rglob("*.py"))
             if (lines := sleeps_then_asserts(p.read_text()))}
    assert found == {}, "wait on a condition (tests/waiting.py), or mark a quiet period '# quiet: why'"


def test_no_test_polls_by_hand() -> None:
    found = {str(p.relative_to(TESTS)): lines for p in sorted(TESTS.rglob("*.py"))
             if p != TESTS / "waiting.py" and (lines := polls_by_hand(p.read_text()))}
    assert found == {}, "poll with tests/waiting.py (until, wait_until), or mark a sleep that is not a poll"
