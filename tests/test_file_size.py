"""Product code stays small enough to read, or says why it is one piece: a file over 600
lines, a function over 100, a class over 400 lines or 30 methods has a paragraph starting
``One piece:`` in its docstring."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("thaw", "activator", "warm_pool", "worker", "weight_streaming", "snapshotter", "simulator", "loadtests")
MAX_LINES = 600


def test_long_files_say_why_they_are_one_piece() -> None:
    unexplained = {}
    for package in PACKAGES:
        for p in (ROOT / package).rglob("*.py"):
            text = p.read_text()
            n = text.count("\n")
            if n > MAX_LINES and "One piece:" not in "\n".join(text.splitlines()[:80]):
                unexplained[str(p.relative_to(ROOT))] = n
    assert unexplained == {}, "split these, or say why each is one piece (a 'One piece:' paragraph at its top)"


MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 400
MAX_METHODS = 30


def _says_why(node: ast.AST) -> bool:
    doc = ast.get_docstring(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
    return doc is not None and "One piece:" in doc


def test_functions_and_classes_stay_small_or_say_why() -> None:
    # No function over 100 lines, no class over 400 lines or 30 methods, unless its
    # docstring has a paragraph starting "One piece:" saying why.
    found = {}
    for package in PACKAGES:
        for p in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or _says_why(node):
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                too_big = (lines > MAX_CLASS_LINES or methods > MAX_METHODS if isinstance(node, ast.ClassDef)
                           else lines > MAX_FUNCTION_LINES)
                if too_big:
                    found[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = (lines, methods)
    assert found == {}, "split these, or say why each is one piece ('One piece:' in its docstring)"
