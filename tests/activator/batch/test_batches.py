"""The activator's Batches API (activator.batch.batches): a request checked as OpenAI checks
it before the controller is asked, and a batch shown in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import pytest

from activator.batch.batches import BatchesApi, batch_object
from activator.errors import BadRequest
from thaw.controllers import ControllerClient
from thaw.wire import BatchCounts, BatchLineError, BatchRecord

GOOD = {"input_file_id": "file-0123456789abcdef", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


@pytest.mark.parametrize("body, param", [
    ([1, 2], None),
    ({k: v for k, v in GOOD.items() if k != "input_file_id"}, "input_file_id"),
    ({k: v for k, v in GOOD.items() if k != "endpoint"}, "endpoint"),
    ({**GOOD, "endpoint": "/v1/embeddings"}, "endpoint"),
    ({**GOOD, "completion_window": "1h"}, "completion_window"),
    ({**GOOD, "colour": "red"}, "colour"),
    ({**GOOD, "input_file_id": "not-a-file"}, "input_file_id"),
    ({**GOOD, "metadata": {str(i): "x" for i in range(17)}}, "metadata"),
    ({**GOOD, "metadata": {"k": "v" * 513}}, "metadata"),
])
async def test_a_bad_batch_request_is_refused_before_the_controller_is_asked(body: Any, param: str | None) -> None:
    api = BatchesApi(ControllerClient("http://127.0.0.1:9", None))  # nothing listens: never called
    try:
        with pytest.raises(BadRequest) as info:
            await api.create("acme", body)
        assert info.value.param == param
    finally:
        await api.controller.aclose()


def test_a_batch_in_openais_shape() -> None:
    b = BatchRecord(id="batch_1", tenant="acme", input_file_id="file-0123456789abcdef",
                    endpoint="/v1/chat/completions", completion_window="24h", status="failed", created_at=100.7,
                    expires_at=86500.2, failed_at=101.0, metadata={"job": "x"},
                    errors=[BatchLineError(code="invalid_file", message="not JSONL", param="input_file_id")],
                    request_counts=BatchCounts(total=3, completed=1, failed=2))
    o = batch_object(b)
    assert o["object"] == "batch" and o["created_at"] == 100 and o["expires_at"] == 86500 and o["failed_at"] == 101
    assert "tenant" not in o and o["completed_at"] is None
    assert o["errors"] == {"object": "list", "data": [{"code": "invalid_file", "message": "not JSONL",
                                                       "param": "input_file_id", "line": None}]}
    assert o["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert batch_object(b.model_copy(update={"errors": []}))["errors"] is None
