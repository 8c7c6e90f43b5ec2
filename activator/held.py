"""What a streamed request held for a cold start is told before its first token.

After ``server.held_progress_interval_s`` without a byte, the activator answers 200 and
sends SSE comment lines at that interval (a line that starts with ``:`` is ignored by
every SSE reader, OpenAI's clients among them): the phase the request waits in and, when
this activator has seen the model start before, the time left. Once the engine's
answer begins, one more comment says where it came from (what the response headers say
of a request answered before any comment). A failure after the 200 is an SSE error
event in OpenAI's shape, then ``data: [DONE]``. See docs/REQUEST_PATH.md.
"""

from __future__ import annotations

import json
from typing import Literal

from activator.context import RequestContext
from activator.errors import ApiError, error_body, sse_error_event

# waiting for an instance to be given the model; a replica loading it (weights, engine);
# sent to the replica, its first token not yet out.
HeldPhase = Literal["queued", "loading", "first_token"]


def held_phase(sent: bool, loading: int) -> HeldPhase:
    """Where a held request waits: sent to its replica, a replica loading, else queued."""
    if sent:
        return "first_token"
    return "loading" if loading else "queued"


def progress_comment(phase: HeldPhase, held_s: float, expected_s: float | None) -> bytes:
    """One progress line: the phase, how long held, and (``expected_s``: what a cold start
    of this model has taken) the time left, never below zero."""
    line = f": thaw held phase={phase} held_s={held_s:.1f}"
    if expected_s is not None:
        line += f" expected_left_s={max(expected_s - held_s, 0.0):.1f}"
    return (line + "\n\n").encode()


def ready_comment(ctx: RequestContext) -> bytes:
    """The line sent as the answer begins: the headers' facts it could not carry."""
    parts = [f"queue_ms={round(ctx.queue_s * 1000)}"]
    if ctx.tier:
        parts.append(f"tier={ctx.tier}")
    if ctx.replica:
        parts.append(f"replica={ctx.replica}")
    return (": thaw ready " + " ".join(parts) + "\n\n").encode()


def error_event(exc: ApiError) -> bytes:
    """A refusal after the 200 was sent: the error as an event, then the end."""
    return sse_error_event(json.dumps(error_body(exc.status, exc.message, exc.type, exc.param, exc.code)).encode())
