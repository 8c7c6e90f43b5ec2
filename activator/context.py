"""What the activator knows of one completion request as it goes: who, which model, how
it was routed (cold or hot, the replica, where that replica got the model), its usage
and timings. The service fills it in; the recorder (``activator.recording``) writes it
to the ledger; the response headers are read from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from activator.limits import Admission
from activator.routing.replicas import Replica
from activator.usage import Usage
from thaw.config import Model
from thaw.telemetry import TraceContext


@dataclass
class RequestContext:
    request_id: str
    arrival: float
    model: Model | None = None
    status: int = 0
    cold: bool = False
    queue_s: float = 0.0
    enqueued_at: float | None = None
    first_byte_at: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tenant: str | None = None
    stream: bool = False
    # The GenAI conventions' gen_ai.operation.name: chat, text_completion (None: not a
    # completion request).
    operation: str | None = None
    replica: str | None = None
    # The model's registry revision that replica serves (None: not known).
    revision: int | None = None
    # hot, or where the cold start's replica got the model from (thaw.wire.Tier).
    tier: str | None = None
    usage: Usage = field(default_factory=Usage)
    cancelled: bool = False
    # Sent to its replica (a slot acquired); answered 200 while held for a cold start,
    # before its first token (activator.held).
    sent: bool = False
    held: bool = False
    # Its trace (activator.tracing; None: tracing off) and the caller's span it continues
    # (None: the caller sent no traceparent); the replica that answered, kept for its
    # spans.
    trace: TraceContext | None = None
    trace_parent_id: int | None = None
    served_by: Replica | None = None
    recorded: bool = False
    admission: Admission | None = None
    # The prompt was counted exactly before admission (False: admitted on its bound, or
    # the model has no tokenizer: activator.token_bound).
    counted: bool = False
    rate_headers: dict[str, str] = field(default_factory=dict)
    # "batch" for a batch's line (activator.batch.worker); None online.
    service_tier: str | None = None

    def response_headers(self) -> dict[str, str]:
        h = {**self.rate_headers, "x-request-id": self.request_id,
             "x-thaw-cold-start": "true" if self.cold else "false"}
        if self.cold and not self.held:  # held: answered before its wait ended (activator.held)
            h["x-thaw-queue-ms"] = str(round(self.queue_s * 1000))
        if self.replica:
            h["x-thaw-replica"] = self.replica
        if self.tier:
            h["x-thaw-tier"] = self.tier
        return h
