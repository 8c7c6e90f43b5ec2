"""A plan as a plain-text table, Markdown, or JSON. Pure: strings in, strings out."""

from __future__ import annotations

import json

from thaw.planner.sizing import Plan


def fmt(value: float | int | str) -> str:
    """A step's value for reading: thousands separators, four significant digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e9):
        return f"{int(value):,}"
    if abs(value) >= 1e9:
        return f"{value:.4g}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def headline(plan: Plan) -> list[tuple[str, str]]:
    """The results a reader wants first, as (label, text) pairs."""
    if plan.problem is not None:
        return [("model", plan.model), ("gpu", plan.gpu), ("fits", "yes" if plan.fits else "no"),
                ("problem", plan.problem)]
    return [
        ("model", plan.model),
        ("gpu", plan.gpu),
        ("replicas", f"{plan.replicas:,} x {plan.gpus_per_replica} GPUs (tensor parallel)"),
        ("GPUs", f"{plan.gpus:,}"),
        ("instances", f"{plan.instances:,} x {plan.instance}"),
        ("cost", f"${plan.usd_per_hour:,.2f}/h"),
        ("cost per million tokens", f"${plan.usd_per_million_tokens:.4g} (input + output)"),
        ("power", f"{plan.power_kw:,.1f} kW"),
        ("limiting constraint", plan.limiting),
    ]


def table(plan: Plan) -> str:
    """Headline results, then every step aligned in columns: step, value, unit, source."""
    head = headline(plan)
    width = max(len(k) for k, _ in head)
    lines = [f"{k:<{width}}  {v}" for k, v in head]
    rows = [(s.name, fmt(s.value), s.unit, s.source) for s in plan.steps]
    header = ("step", "value", "unit", "source or formula")
    w = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines += ["", f"{header[0]:<{w[0]}}  {header[1]:>{w[1]}}  {header[2]:<{w[2]}}  {header[3]}",
              f"{'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}  {'-' * len(header[3])}"]
    lines += [f"{n:<{w[0]}}  {v:>{w[1]}}  {u:<{w[2]}}  {src}".rstrip() for n, v, u, src in rows]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(plan: Plan) -> str:
    """Headline results as a two-column table, then the steps as a Markdown table."""
    lines = ["| result | value |", "| --- | --- |"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in headline(plan)]
    lines += ["", "| step | value | unit | source or formula |", "| --- | ---: | --- | --- |"]
    lines += [f"| {_cell(s.name)} | {_cell(fmt(s.value))} | {_cell(s.unit)} | {_cell(s.source)} |"
              for s in plan.steps]
    return "\n".join(lines)


def to_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2)

