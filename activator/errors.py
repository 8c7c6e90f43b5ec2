"""Errors as OpenAI returns them, mapped in one place.

Every failure the activator answers is an ``ApiError`` rendered by
``error_response``: ``{"error": {"message", "type", "param", "code"}}`` with the right
status and, for 429/503, a ``Retry-After`` header. Nothing else reaches the client:
an unexpected exception becomes a 500 with a request id and no stack trace.
"""

from __future__ import annotations

import json
import math

from fastapi.responses import JSONResponse


class ApiError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})


class BadRequest(ApiError):
    status, type, code = 400, "invalid_request_error", None


class Unauthorized(ApiError):
    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class NotFound(ApiError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class ObjectNotFound(ApiError):
    """A file or batch that is not the caller's (or not at all): OpenAI's "No such ...
    object", with no code."""

    status, type, code = 404, "invalid_request_error", None


class RequestTimeout(ApiError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class PayloadTooLarge(ApiError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class HeadersTooLarge(ApiError):
    status, type, code = 431, "invalid_request_error", "request_header_fields_too_large"


class TooManyRequests(ApiError):
    status, type, code = 429, "rate_limit_exceeded", "queue_full"


class TooManyFailedAuth(ApiError):
    status, type, code = 429, "rate_limit_exceeded", "too_many_failed_auth"


class ServiceUnavailable(ApiError):
    status, type, code = 503, "server_error", "model_unavailable"


class UpstreamError(ApiError):
    status, type, code = 502, "server_error", "upstream_error"


def error_body(status: int, message: str, type_: str, param: str | None, code: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    h = {**exc.headers, **(headers or {})}
    if exc.retry_after_s is not None:
        h["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return JSONResponse(
        error_body(exc.status, exc.message, exc.type, exc.param, exc.code), status_code=exc.status, headers=h
    )


def internal_error_body(request_id: str) -> dict[str, object]:
    """What a client is told of our own bug: its request id, no detail."""
    return error_body(500, f"internal error (request id {request_id}); the operator's logs have the details",
                      "server_error", None, "internal_error")


def internal_error_response(request_id: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(internal_error_body(request_id), status_code=500, headers=headers)


def sse_error_event(body: bytes) -> bytes:
    """An error (``body``: JSON in OpenAI's error shape) inside a stream already under
    way, as an event, then the stream's end."""
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def upstream_error_body(status: int, content: bytes) -> bytes:
    """The engine's refusal in OpenAI's error shape: its message and param as it sent
    them, the type OpenAI gives the status, the code only when it is OpenAI's kind (a
    string: vLLM repeats the status as a number there)."""
    try:
        err = json.loads(content)["error"]
        message = err["message"]
        if not isinstance(message, str):
            raise TypeError(message)
    except (ValueError, TypeError, KeyError):
        err, message = {}, content.decode("utf-8", "replace").strip()[:2000] or f"the engine answered {status}"
    param, code = err.get("param"), err.get("code")
    return json.dumps(error_body(
        status, message, "invalid_request_error" if status < 500 else "server_error",
        param if isinstance(param, str) else None, code if isinstance(code, str) else None,
    )).encode()
