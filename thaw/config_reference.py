"""docs/reference/config.md, generated from the config models in :mod:`thaw.config`.

Each field's text is the comment block written above it in ``thaw/config.py`` (or its
``Field(description=...)``); a field with none that directly follows another shares
that one's comment, and a section with none gets its class docstring's first sentence. Each section's text is its class docstring. Types,
bounds and defaults come from the pydantic models themselves, so the page says what the
code accepts.

    python -m thaw.config_reference --write   # regenerate the page
    python -m thaw.config_reference --check   # exit 1 when the page is out of date
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from thaw import config

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference" / "config.md"
COMMAND = "python -m thaw.config_reference --write"

HEADER = f"""# Config file reference

<!-- Generated from thaw/config.py by `{COMMAND}`; do not edit by hand. -->

Every section and field of the YAML file that `thaw up`, `thaw controller`, `thaw activator`
and `thaw worker` read (the default is [examples/thaw.yaml](../../examples/thaw.yaml), which is
commented). `${{VAR}}` and `${{VAR:-default}}` are replaced from the environment before the file is
read; an unknown key is an error; `thaw config check FILE` prints every problem with the field
it concerns. `data_dir` is resolved against the directory `thaw` runs in. A field marked
*required* has no default. `name` is 1-63 letters, digits, `.`, `_` or `-`, starting with a
letter or digit.

The `models` and `tenants` lists only seed a new cluster: once the controller has its state
database, change models with `thaw models ...` and tenants with `thaw tenants ...`
([serving your model](../guide/serve-your-model.md), [tenants](../guide/tenants.md)).
"""


@dataclass(frozen=True)
class Section:
    path: str  # how the YAML reaches it: "models[].autoscaling"
    model: type[BaseModel]


def field_comments(cls: type[BaseModel]) -> dict[str, str]:
    """Each field's comment block in the class's source (the lines of ``#`` directly above
    it). A field with none that directly follows another shares that one's (a group:
    ``prompt_usd_per_mtok``, ``cached_usd_per_mtok``...), unless it is a section."""
    lines, _ = inspect.getsourcelines(cls)
    body = ast.parse("".join(lines)).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, str] = {}
    previous: tuple[str, int] | None = None  # (comment, end line) of the field before
    for node in body.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            previous = None
            continue
        i = node.lineno - 2  # 0-based index of the line above the field
        block: list[str] = []
        while i >= 0 and lines[i].strip().startswith("#"):
            block.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        name = node.target.id
        is_section = bool(_models_of(cls.model_fields[name].annotation))
        if block:
            text = " ".join(block)
        elif previous is not None and previous[1] == node.lineno - 1 and not is_section:
            text = previous[0]  # one comment above a group of fields
        else:
            text = ""
        out[name] = text
        previous = (text, node.end_lineno or node.lineno)
    return out


def _bounds(metadata: list[Any]) -> list[str]:
    words = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            words += _bounds(m.metadata)
        elif isinstance(m, annotated_types.Gt):
            words.append(f"> {m.gt:g}")
        elif isinstance(m, annotated_types.Ge):
            words.append(f">= {m.ge:g}")
        elif isinstance(m, annotated_types.Lt):
            words.append(f"< {m.lt:g}")
        elif isinstance(m, annotated_types.Le):
            words.append(f"<= {m.le:g}")
        elif isinstance(m, annotated_types.MinLen) and m.min_length > 0:
            words.append(f"at least {m.min_length}")
    return words


def _named(base: str, metadata: list[Any]) -> str:
    """``str`` with the pattern or check that makes it one of the config's own kinds."""
    for m in metadata:
        inner = m.metadata if isinstance(m, FieldInfo) else [m]
        for x in inner:
            pattern = getattr(x, "pattern", None)
            if pattern == config.NAME_PATTERN:
                return "name"
            if pattern == config.BUCKET_PATTERN:
                return "bucket name"
            if pattern == r"^sha256:[0-9a-f]{64}$":
                return "`sha256:` + 64 hex digits"
            if pattern == r"^https?://\S+$":
                return "http(s) URL"
            if pattern is not None:
                return f"string matching `{pattern}`"
            if getattr(getattr(x, "func", None), "__name__", "") == "check_uri":
                return "s3:// URI"
    return base


def type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A reader's name for a field's type: ``float > 0``, ``list of name``, ``"a" | "b"``."""
    metadata = list(metadata or [])
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return type_text(base, extra + metadata)
    if origin in (typing.Union, UnionType):
        args = typing.get_args(annotation)
        parts = [type_text(a, metadata) for a in args if a is not NoneType]
        return " | ".join(parts) + (" | null" if NoneType in args else "")
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        bounds = _bounds(metadata)
        return f"list of {type_text(item)}" + (f" ({', '.join(bounds)} items)" if bounds else "")
    if origin is dict:
        key, value = typing.get_args(annotation)
        return "map of string to " + ("any" if value is Any else type_text(value))
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor_of(annotation)})"
    names = {str: "string", int: "int", float: "number", bool: "bool", Path: "path", SecretStr: "secret string"}
    base = _named(names.get(annotation, getattr(annotation, "__name__", str(annotation))), metadata)
    bounds = _bounds(metadata)
    return base + (" " + ", ".join(bounds) if bounds else "")


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "*required*"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if isinstance(value, Path):
        return f"`{value}`"
    if value is None or value is PydanticUndefined:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    return f"`{json.dumps(value)}`"


def _anchor_of(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field's type holds (a section, a list of them, optional)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_of(a)]


def sections(root: type[BaseModel] = config.ThawConfig) -> list[Section]:
    """Every model reachable from ``root``, depth first in field order, each once."""
    found: list[Section] = []
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], path: str) -> None:
        if model in seen:
            return
        seen.add(model)
        found.append(Section(path, model))
        for name, field in model.model_fields.items():
            is_list = typing.get_origin(field.annotation) is list
            for sub in _models_of(field.annotation):
                walk(sub, f"{path}.{name}{'[]' if is_list else ''}".lstrip("."))

    walk(root, "")
    return found


def _section_summary(annotation: Any) -> str:
    """For a section field with no comment of its own: its section's first sentence."""
    for model in _models_of(annotation):
        doc = vars(model).get("__doc__")
        if doc:
            return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()).split(". ")[0].rstrip(".") + "."
    return ""


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole page."""
    out = [HEADER]
    for s in sections():
        title = "The top level" if not s.path else f"`{s.path}`"
        out.append(f'<a id="{_anchor_of(s.model)}"></a>\n\n## {title}\n')
        doc = vars(s.model).get("__doc__")  # its own, not BaseModel's
        for para in inspect.cleandoc(doc).split("\n\n") if doc else []:
            out.append(" ".join(para.replace("``", "`").split()) + "\n")
        comments = field_comments(s.model)
        out.append("| field | type | default | what it does |\n| --- | --- | --- | --- |")
        for name, field in s.model.model_fields.items():
            text = field.description or comments.get(name, "") or _section_summary(field.annotation)
            out.append(f"| `{name}` | {_cell(type_text(field.annotation, field.metadata))} | "
                       f"{_cell(default_text(field))} | {_cell(text)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from thaw.generated_page import write_or_check

    return write_or_check(argv, prog="python -m thaw.config_reference", description=(__doc__ or "").split("\n\n")[0], page=REFERENCE,
                          root=ROOT, render=render, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())
