"""One dispatch for every decision (warm_pool.policy.decisions), proven exhaustive by mypy."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

import warm_pool.policy.decisions as D

ROOT = Path(__file__).resolve().parents[3]

ONE_OF_EACH: list[D.Decision] = [
    D.Assign("w", "m", "a-1"), D.Release("w", "m", "idle"), D.Sleep("w", "m"), D.Launch("gpu", "standby"),
    D.Terminate("w", "unreachable"), D.Stop("w", "excess_standby"), D.Start("w", "standby"),
    D.Prebuild("w", "m", "c"), D.Pack("w", "m", "a-2", "e", 1), D.LoadAdapter("w", "m"),
    D.UnloadAdapter("w", "m", "idle"),
]


class Recorder:
    """An executor that notes which of its methods each decision reached."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda d, ctx: self.calls.append((name, d, ctx))


def test_every_decision_reaches_the_method_of_its_type() -> None:
    assert {type(d) for d in ONE_OF_EACH} == set(get_args(D.Decision))
    r = Recorder()
    for d in ONE_OF_EACH:
        D.carry_out(d, r, 7)  # type: ignore[arg-type]
    names = {n for n in vars(D.Executor) if not n.startswith("_")}
    # Each decision went to one method, each method got one kind, the context passed along.
    assert [type(d).__name__ for _, d, _ in r.calls] == [type(d).__name__ for d in ONE_OF_EACH]
    assert {n for n, _, _ in r.calls} == names and len(names) == len(ONE_OF_EACH)
    assert all(ctx == 7 for *_, ctx in r.calls)
    assert [n for n, _, _ in r.calls][:3] == ["assign", "release", "sleep"]


def test_decisions_are_plain_values() -> None:
    for d in ONE_OF_EACH:
        assert dataclasses.is_dataclass(d) and hash(d) == hash(dataclasses.replace(d))


def _scratch(tmp: Path, *, case: bool) -> Path:
    """A scratch copy of the two executors' packages whose decisions module has a new
    decision type, Drain, in the union; with ``case``, also its case in carry_out and its
    method in the Executor protocol (the executors left as they are)."""
    for pkg in ("warm_pool", "simulator"):
        shutil.copytree(ROOT / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / "thaw").symlink_to(ROOT / "thaw")
    p = tmp / "warm_pool" / "policy" / "decisions.py"
    s = p.read_text()
    assert "\nDecision = " in s and "        case _:\n            assert_never(d)" in s
    s = s.replace("\nDecision = ", "\n@dataclass(frozen=True)\nclass Drain:\n    worker_id: str\n\n\n"
                                   "Decision = Drain | ", 1)
    if case:
        s = s.replace("    def unload_adapter(self, d: UnloadAdapter, ctx: Ctx) -> None: ...\n",
                      "    def unload_adapter(self, d: UnloadAdapter, ctx: Ctx) -> None: ...\n"
                      "    def drain(self, d: Drain, ctx: Ctx) -> None: ...\n", 1)
        s = s.replace("        case _:\n            assert_never(d)",
                      "        case Drain():\n            to.drain(d, ctx)\n        case _:\n            assert_never(d)", 1)
    p.write_text(s)
    return tmp


def _mypy(where: Path) -> tuple[int, list[str]]:
    r = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
                        "--no-incremental", "warm_pool/policy/decisions.py", "warm_pool/fleet/actuator.py", "simulator/effects.py"],
                       cwd=where, capture_output=True, text=True, timeout=300)
    return r.returncode, [line for line in r.stdout.splitlines() if ": error:" in line]


@pytest.mark.parametrize("case", [False, True], ids=["new type only", "with its case in carry_out"])
def test_a_new_decision_type_fails_the_type_check_until_both_executors_carry_it_out(
        tmp_path: Path, case: bool) -> None:
    rc, errors = _mypy(_scratch(tmp_path, case=case))
    assert rc == 1, errors
    files = sorted({e.split(":", 1)[0] for e in errors})
    if not case:
        # The dispatch is the one place that notices: its assert_never gets a Drain.
        assert files == ["warm_pool/policy/decisions.py"] and "assert_never" in errors[0] and "Drain" in errors[0]
    else:
        # The dispatch is whole; each executor lacks the protocol's new method.
        assert files == ["simulator/effects.py", "warm_pool/fleet/actuator.py"], errors
        assert all('to "carry_out" has incompatible type' in e for e in errors), errors
