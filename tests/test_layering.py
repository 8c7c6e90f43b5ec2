"""The dependency direction between packages (docs/DESIGN.md), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("thaw", "activator", "warm_pool", "worker", "weight_streaming", "snapshotter", "simulator", "loadtests")

# package -> packages it must never import (anywhere in its files, lazily or not)
FORBIDDEN = {
    "activator": {"worker", "warm_pool", "weight_streaming", "snapshotter", "simulator"},
    "warm_pool": {"worker", "activator", "weight_streaming", "snapshotter", "simulator"},
    "worker": {"activator", "warm_pool", "simulator"},
    "snapshotter": {"worker", "activator", "warm_pool", "weight_streaming", "simulator"},
    "weight_streaming": {"worker", "activator", "warm_pool", "snapshotter", "simulator"},
    # The simulator runs the controller's policy functions, never a service.
    "simulator": {"worker", "activator", "weight_streaming", "snapshotter", "loadtests"},
}


def imported_packages(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out & set(PACKAGES)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downstream(package: str) -> None:
    bad = {str(p.relative_to(ROOT)): sorted(imported_packages(p) & FORBIDDEN[package])
           for p in (ROOT / package).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_thaw_imports_no_other_package_outside_its_cli() -> None:
    bad = {}
    for p in (ROOT / "thaw").rglob("*.py"):
        if "cli" in p.relative_to(ROOT / "thaw").parts:
            continue
        found = imported_packages(p) - {"thaw"}
        if found:
            bad[str(p.relative_to(ROOT))] = sorted(found)
    assert bad == {}
