"""A batch input file's lines, checked one at a time (pure).

OpenAI's batch input is JSONL, one request a line: ``{"custom_id", "method": "POST",
"url": <the batch's endpoint>, "body": {... "model" ...}}``. A line that is not such a
request is an error of its own (its 1-based line number, a code and the reason) and the
others run; a file in which no line is JSON at all is not JSONL, and the whole batch
fails. Blank lines are not requests. The first line with a ``custom_id`` runs; a later
one with the same id is an error (results are keyed by it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thaw.config import ThawConfig

MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class BatchRequest:
    line: int
    custom_id: str
    # The model the tenant named (as it calls it) and the registry's name for it.
    model: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    line: int
    custom_id: str | None
    code: str
    message: str
    param: str | None = None


@dataclass
class CheckedLines:
    requests: list[BatchRequest] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    # Set when the file is not JSONL at all (the batch fails); why.
    not_jsonl: str | None = None


def check_lines(lines: Iterable[bytes], endpoint: str, resolve: Callable[[str], str | None]) -> CheckedLines:
    """``lines``: the file's lines (with or without their newlines); ``resolve``: the
    registry's name of a model the tenant may use under the name it gave, else None."""
    out = CheckedLines()
    seen: set[str] = set()
    parsed_any = False
    first_bad: tuple[int, str] | None = None
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            reason = f"not JSON: {exc}"
            first_bad = first_bad or (n, reason)
            out.errors.append(LineError(n, None, "invalid_json_line", reason))
            continue
        parsed_any = True
        problem = _check(item, endpoint, resolve, seen)
        if isinstance(problem, LineError):
            out.errors.append(LineError(n, problem.custom_id, problem.code, problem.message, problem.param))
        else:
            custom_id, model = problem
            seen.add(custom_id)
            out.requests.append(BatchRequest(n, custom_id, model, item["body"]))
    if not parsed_any:
        out.not_jsonl = ("the file is not JSONL: no line is a JSON object"
                         + (f" (line {first_bad[0]}: {first_bad[1]})" if first_bad else " (it has no lines)"))
        out.requests.clear()
    return out


def _check(item: Any, endpoint: str, resolve: Callable[[str], str | None],
           seen: set[str]) -> LineError | tuple[str, str]:
    """(custom_id, registry model name) of a good request, else the line's error (its
    ``line`` filled in by the caller)."""
    if not isinstance(item, dict):
        return LineError(0, None, "invalid_request", "a line must be a JSON object (a request)")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(0, None, "missing_custom_id", "'custom_id' is required: a non-empty string", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        return LineError(0, custom_id[:64], "invalid_custom_id",
                         f"'custom_id' is over {MAX_CUSTOM_ID} characters", "custom_id")
    if custom_id in seen:
        return LineError(0, custom_id, "duplicate_custom_id",
                         f"custom_id {custom_id!r} is on an earlier line (each request's must be unique)", "custom_id")
    if item.get("method") != "POST":
        return LineError(0, custom_id, "invalid_method", f"'method' must be 'POST', not {item.get('method')!r}",
                         "method")
    if item.get("url") != endpoint:
        return LineError(0, custom_id, "invalid_url",
                         f"'url' must be the batch's endpoint {endpoint!r}, not {item.get('url')!r}", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        return LineError(0, custom_id, "invalid_body", "'body' must be a JSON object (the request)", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return LineError(0, custom_id, "missing_model", "'body.model' is required", "body.model")
    if body.get("stream"):
        return LineError(0, custom_id, "invalid_request", "a batch request is answered whole: 'stream' must not "
                         "be true", "body.stream")
    name = resolve(model)
    if name is None:
        return LineError(0, custom_id, "model_not_found", f"the model {model!r} does not exist", "body.model")
    return custom_id, name


def tenant_models(cfg: ThawConfig, tenant: str) -> Callable[[str], str | None]:
    """For :func:`check_lines`: the registry's name of the model ``requested`` names (its
    name or served name) if ``tenant`` may use it, as the activators decide it: a model
    private to a tenant is that tenant's only; any other, per ``allowed_models``."""
    t = next((x for x in cfg.tenants if x.name == tenant), None)

    def resolve(requested: str) -> str | None:
        m = cfg.model(requested)
        if m is None or t is None:
            return None
        if m.tenant is not None:
            return m.name if m.tenant == tenant else None
        return m.name if "*" in t.allowed_models or m.name in t.allowed_models else None

    return resolve
