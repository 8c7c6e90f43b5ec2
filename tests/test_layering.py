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


def is_test_module(name: str) -> bool:
    """A module pytest collects as a test file (its default python_files: test_*.py, *_test.py)."""
    return name.startswith("test_") or name.endswith("_test")


def imported_test_modules(path: Path) -> list[str]:
    """The test modules path imports, at any nesting level (inside functions too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if any(map(is_test_module, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if any(map(is_test_module, (node.module or "").split("."))):
                out.append(module)
            # `from tests.x import test_y` or `from . import test_y` imports the module itself.
            elif node.level or module.split(".")[0] == "tests":
                sep = "" if module.endswith(".") else "."
                out += [module + sep + a.name for a in node.names if is_test_module(a.name)]
    return out


def test_no_test_module_imports_another_test_module() -> None:
    # Shared helpers live in non-test modules (tests/<package>/support.py, tests/redis_server.py):
    # importing a test module makes pytest run its tests twice and couples unrelated tests.
    bad = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "tests").rglob("*.py"))
           if (found := imported_test_modules(p))}
    assert bad == {}


# Feature folders inside a service: one folder per feature, none importing another's.
FEATURE_FOLDERS = {"warm_pool": ("batch", "conversations", "policy", "providers", "registry"),
                   "activator": ("batch", "conversations")}


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("service", sorted(FEATURE_FOLDERS))
def test_a_feature_folder_imports_no_other_feature_folder(service: str) -> None:
    folders = FEATURE_FOLDERS[service]
    bad = {}
    for folder in folders:
        others = tuple(f"{service}.{o}" for o in folders if o != folder)
        for p in (ROOT / service / folder).rglob("*.py"):
            found = sorted(m for m in imported_modules(p) if m.startswith(others))
            if found:
                bad[str(p.relative_to(ROOT))] = found
    assert bad == {}
    for folder in folders:  # each one a package with a docstring saying what it holds
        init = ROOT / service / folder / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), init


# Folders that compose the feature folders (the controller's fleet builds on the policy's
# decisions and the providers' instances): a feature folder never imports one of them.
CORE_FOLDERS = {"warm_pool": ("fleet",)}


@pytest.mark.parametrize("service", sorted(CORE_FOLDERS))
def test_no_feature_folder_imports_a_core_folder(service: str) -> None:
    core = tuple(f"{service}.{c}" for c in CORE_FOLDERS[service])
    bad = {str(p.relative_to(ROOT)): found for folder in FEATURE_FOLDERS[service]
           for p in (ROOT / service / folder).rglob("*.py")
           if (found := sorted(m for m in imported_modules(p) if m.startswith(core)))}
    assert bad == {}
    for folder in CORE_FOLDERS[service]:
        init = ROOT / service / folder / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), init


def test_the_agent_never_imports_what_runs_in_the_engine_host() -> None:
    # The engine host is another process (vLLM imported): the agent starts it by module
    # name and speaks to it through worker.launch's messages, never by import.
    host = ROOT / "worker" / "engine_host"
    bad = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "worker").rglob("*.py"))
           if host not in p.parents
           and (found := sorted(m for m in imported_modules(p) if m.startswith("worker.engine_host")))}
    assert bad == {}
    assert ast.get_docstring(ast.parse((host / "__init__.py").read_text()))


def test_the_policy_is_pure() -> None:
    # The policy folder imports nothing of the controller's I/O and no clock or network:
    # thaw's config and wire types, its own stages, the standard library.
    allowed_prefixes = ("thaw.config", "thaw.wire", "thaw.cron", "thaw.units", "thaw.engine_class",
                        "thaw.fit", "warm_pool.policy", "__future__")
    io = ("asyncio", "socket", "httpx", "boto3", "psycopg", "sqlite3", "time", "subprocess", "fastapi")
    bad = {}
    for p in (ROOT / "warm_pool" / "policy").rglob("*.py"):
        mods = imported_modules(p)
        found = sorted(m for m in mods if (m.split(".")[0] in PACKAGES and not m.startswith(allowed_prefixes))
                       or m.split(".")[0] in io)
        if found:
            bad[str(p.relative_to(ROOT))] = found
    assert bad == {}


def test_only_the_app_mounts_the_activators_routers() -> None:
    # activator/api/ is the HTTP layer over the activator's parts: nothing below imports it.
    bad = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.startswith("activator.api"))
           for p in (ROOT / "activator").rglob("*.py")
           if "api" not in p.relative_to(ROOT / "activator").parts[:1] and p.name != "app.py"}
    assert {k: v for k, v in bad.items() if v} == {}
