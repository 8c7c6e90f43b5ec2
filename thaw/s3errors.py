"""What an S3 error means: one table from S3's error codes to a typed failure kind, for
every caller that talks to a store (boto3 or aioboto3, AWS or SeaweedFS).

A HEAD has no body, so its errors carry only the HTTP status as their code ("404",
"403"): both spellings are in the table. Nothing here imports botocore; an error is
read through its ``response`` dict, as botocore's ``ClientError`` carries it.
"""

from __future__ import annotations

from enum import StrEnum


class S3Failure(StrEnum):
    NO_BUCKET = "no_bucket"  # the bucket does not exist
    NOT_FOUND = "not_found"  # the key does not exist (or a HEAD's bare 404)
    DENIED = "denied"  # the credentials may not do it
    CHANGED = "changed"  # a precondition (If-Match) failed: the object was replaced
    BUCKET_EXISTS = "bucket_exists"  # CreateBucket: it exists already
    OTHER = "other"  # any other answer from the store


_KINDS: dict[str, S3Failure] = {
    "NoSuchBucket": S3Failure.NO_BUCKET,
    **dict.fromkeys(("NoSuchKey", "404", "NotFound"), S3Failure.NOT_FOUND),
    **dict.fromkeys(("AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "ExpiredToken"), S3Failure.DENIED),
    **dict.fromkeys(("PreconditionFailed", "412"), S3Failure.CHANGED),
    **dict.fromkeys(("BucketAlreadyOwnedByYou", "BucketAlreadyExists"), S3Failure.BUCKET_EXISTS),
}


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of an answer from the store (its HTTP status when it has no
    code), or None when ``exc`` is not one (connection refused, a timeout)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    err = response.get("Error") or {}
    code = err.get("Code") or (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return str(code) if code is not None else "?"


def classify(exc: BaseException) -> S3Failure | None:
    """The kind of an answer from the store; None when ``exc`` is not one."""
    code = error_code(exc)
    return None if code is None else _KINDS.get(code, S3Failure.OTHER)


def is_missing_key(exc: BaseException) -> bool:
    """The store answered that the key does not exist."""
    return classify(exc) is S3Failure.NOT_FOUND


def error_message(exc: BaseException) -> str:
    """The store's own message for an answer, else the exception's text."""
    response = getattr(exc, "response", None)
    err = (response.get("Error") or {}) if isinstance(response, dict) else {}
    return str(err.get("Message") or exc)
