"""The config in force: the config as written (``base``) serving the registry's models,
each at its current revision's spec.

:func:`with_models` validates it whole, as the config file is: at start (:func:`compose`)
and for ``thaw apply``, which may change every model at once. A deploy, update, rollback
or removal changes one model, and a tenant's change the tenants: :func:`with_change` and
:func:`with_tenants` check only what the change touches, with the rules the file's
validators apply (``thaw.config.check_references`` and the entry readers beside it), and
answer the config, or the problems, that :func:`with_models` would
(tests/warm_pool/registry/test_in_force.py holds them equal). Validated whole, one deploy
among 10,000 models held the controller's event loop for 0.3 s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container
from typing import Any

from pydantic import ValidationError

from thaw.config import (
    ConfigError,
    Model,
    ModelIndex,
    Tenant,
    ThawConfig,
    adapter_entry,
    check_references,
    check_unique_names,
    engine_entry,
    format_errors,
    format_problem,
    parse_config,
)
from thaw.wire import ModelRecord

# What a ConfigError of the config in force names as its source.
SOURCE = "the config in force"

# The spec in force of a model that is in force (``{"name": ..., **spec}`` is its entry).
SpecOf = Callable[[str], dict[str, Any]]


def current_spec(record: ModelRecord) -> dict[str, Any] | None:
    if record.revision is None:
        return None
    return next(r.spec for r in record.revisions if r.revision == record.revision)


def admitted(allowed_models: list[str], names: Container[str]) -> list[str]:
    """A tenant's ``allowed_models`` in force: only the names that are models (or ``*``)."""
    return [a for a in allowed_models if a == "*" or a in names]


def with_models(base: ThawConfig, entries: list[dict[str, Any]]) -> ThawConfig:
    """``base`` serving ``entries`` (config ``models[]`` entries), validated as the config
    file is. A tenant's ``allowed_models`` keeps only the names that exist. Raises
    ``ConfigError``."""
    names = {e["name"] for e in entries}
    data = base.model_dump(mode="json")
    data["models"] = entries
    for t in data["tenants"]:
        t["allowed_models"] = admitted(t["allowed_models"], names)
    return parse_config(data, source=SOURCE)


# A problem of one model names it first: "models[3].shape: ..." (thaw.config.format_errors'
# field path) or "(top level): models[3] (x): ..." (each rule's message).
_ONE_MODELS = re.compile(r"^(?:\(top level\): )?models\[(\d+)\]")


def compose(base: ThawConfig, records: list[ModelRecord]) -> tuple[ThawConfig, list[str]]:
    """The config in force: ``base`` serving each model's current revision. A revision
    the config no longer admits (its shape was removed from the file, say) is left out,
    and so then are its adapters: the second value says which and why. Raises
    ``ConfigError`` for a problem that leaving models out does not solve (a pool that
    builds ahead a model left out)."""
    entries = [{"name": r.name, **spec} for r in records if (spec := current_spec(r)) is not None]
    try:
        return with_models(base, entries), []
    except ConfigError:
        pass
    # Bases before adapters: an adapter is left out with its base, not instead of it.
    entries.sort(key=lambda e: e.get("base") is not None)
    problems: list[str] = []
    # One validation per model left out: each time, the model the first problem names.
    # (Adding models one at a time instead took a validation of all those before it per
    # model, and refused every model before one a pool builds ahead.)
    while True:
        try:
            return with_models(base, entries), problems
        except ConfigError as exc:
            named = [(int(m.group(1)), p) for p in exc.problems if (m := _ONE_MODELS.match(p))]
            if not named:
                raise
            out = named[0][0]
            problems.append(f"{entries[out]['name']}: " + "; ".join(p for i, p in named if i == out))
            entries = [e for i, e in enumerate(entries) if i != out]


def with_change(cfg: ThawConfig, base: ThawConfig, spec_of: SpecOf, name: str,
                spec: dict[str, Any] | None) -> ThawConfig:
    """``cfg`` (``with_models(base, entries)``) with model ``name`` first at ``spec``, or
    without it (``spec`` None): what ``with_models`` gives for the entries so changed, or
    the ``ConfigError`` it raises, without validating again the models the change leaves
    as they were. ``spec``, and what ``spec_of`` gives (the spec of a model of ``cfg``),
    hold no ``name``."""
    others = [m for m in cfg.models if m.name != name]
    index = ModelIndex.of(others)
    first = 0 if spec is None else 1
    # What the change touches, at its place among the models: the entry, and the adapters
    # of the model changed (they take its shape, context and engine).
    touched = [(0, {"name": name, **spec})] if spec is not None else []
    touched += [(j + first, {"name": m.name, **spec_of(m.name)}) for j, m in enumerate(others) if m.base == name]
    gpus = {s.name: s.gpu_count for s in cfg.shapes}

    def entry_of(n: Any) -> dict[str, Any] | None:
        if spec is not None and n == name:
            return engine_entry(touched[0][1], gpus)
        return engine_entry({"name": n, **spec_of(n)}, gpus) if n != name and n in index.by_name else None

    read = _read([(i, engine_entry(e, gpus)) for i, e in touched], entry_of)
    models: list[Model] = [*([read[0][1]] if spec is not None else []), *others]
    by_name, served = dict(index.by_name), dict(index.served)
    for i, m in read:
        models[i] = by_name[m.name] = m
    checked = list(read)
    if spec is not None:
        new = read[0][1]
        holder = served.get(new.resolved_served_name)
        if holder is not None:  # the model that answers to the served name it takes: the rule names both
            at = next(j for j, m in enumerate(models) if m.name == holder)
            checked += [] if any(i == at for i, _ in read) else [(at, models[at])]
        served[new.resolved_served_name] = name
    out = cfg.model_copy(update={"models": models, "tenants": _in_force(base.tenants, by_name)})
    try:
        check_references(out, ModelIndex(by_name, served), sorted(checked, key=lambda c: c[0]))
    except ValueError as exc:
        raise ConfigError(SOURCE, [format_problem(exc)]) from None
    return out


def with_tenants(cfg: ThawConfig, tenants: list[Tenant]) -> ThawConfig:
    """``cfg`` serving ``tenants``: what ``with_models`` gives for the config as written
    with those tenants and ``cfg``'s models, or the ``ConfigError`` it raises, checking
    only what tenants touch (each tenant, and the models a tenant owns)."""
    problems = []
    for i, t in enumerate(tenants):
        try:  # as the file's would be: the admin API builds them with model_copy
            Tenant.model_validate(t.model_dump(mode="json"))
        except ValidationError as exc:
            problems += format_errors(exc, ("tenants", i))
    if not problems:
        try:
            check_unique_names(tenants)
        except ValueError as exc:
            problems.append(format_problem(exc, ("tenants",)))
    if problems:
        raise ConfigError(SOURCE, problems)
    index = ModelIndex.of(cfg.models)
    out = cfg.model_copy(update={"tenants": _in_force(tenants, index.by_name)})
    try:
        check_references(out, index, [(i, m) for i, m in enumerate(cfg.models) if m.tenant is not None])
    except ValueError as exc:
        raise ConfigError(SOURCE, [format_problem(exc)]) from None
    return out


def _in_force(tenants: list[Tenant], names: Container[str]) -> list[Tenant]:
    return [t if (allowed := admitted(t.allowed_models, names)) == t.allowed_models
            else t.model_copy(update={"allowed_models": allowed}) for t in tenants]


def _read(entries: list[tuple[int, Any]], entry_of: Callable[[Any], Any]) -> list[tuple[int, Model]]:
    """``models[i]`` entries as the file's validators read them: adapters filled in from
    their bases (``entry_of``), then each validated (``ConfigError``: every problem)."""
    try:
        filled = [(i, adapter_entry(e, i, entry_of)) for i, e in entries]
    except ValueError as exc:
        raise ConfigError(SOURCE, [format_problem(exc)]) from None
    read, problems = [], []
    for i, e in filled:
        try:
            read.append((i, Model.model_validate(e)))
        except ValidationError as exc:
            problems += format_errors(exc, ("models", i))
    if problems:
        raise ConfigError(SOURCE, problems)
    return read
