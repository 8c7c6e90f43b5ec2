"""``s3://bucket/prefix`` URIs: one parser for every package (no package needs
``weight_streaming`` just to split a URI), and the one check that confines model URIs.

A model URI comes from the config, and reaches a worker in an assignment; a manifest
names the model's files. None of them may reach outside what the operator allowed
(``object_store.allowed_prefixes``): :func:`check_uri` refuses anything that is not a
plain ``s3://bucket/seg/seg`` (another scheme, ``.`` or ``..`` segments, empty
segments, backslashes, percent-encoding) and :func:`check_allowed` compares what is
left with the allowed prefixes segment by segment, so that ``s3://b/models`` admits
``s3://b/models/x`` but not ``s3://b/models-evil/x``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# An S3 bucket name (the config's object_store.bucket is held to it too).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
_BUCKET = re.compile(BUCKET_PATTERN)
# Characters a segment may not hold: a backslash is a separator to some tools,
# percent-encoding hides one (%2e%2e, %2f), control characters and whitespace hide
# anything from a person reading a log.
_FORBIDDEN = re.compile(r"[\\%\x00-\x20\x7f]")


class S3UriError(ValueError):
    pass


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` → ("bucket", "some/prefix"); the prefix may be empty."""
    if not uri.startswith("s3://"):
        raise S3UriError(f"{uri!r} is not an s3:// URI")
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise S3UriError(f"{uri!r} has no bucket")
    return bucket, prefix.strip("/")


def join_key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def check_key_path(path: str, *, what: str | None = None) -> tuple[str, ...]:
    """The segments of a relative object path (``a/b.safetensors``), or
    :class:`S3UriError` for one that could leave the prefix it is joined to: absolute,
    empty, ``.``/``..``/empty segments, backslashes, percent-encoding, control characters.
    ``what`` names the path in the message (default: the path itself)."""
    label = what or repr(path)
    if not path:
        raise S3UriError(f"{label} is empty")
    if path.startswith("/"):
        raise S3UriError(f"{label} is absolute")
    bad = _FORBIDDEN.search(path)
    if bad:
        raise S3UriError(f"{label} holds {bad.group()!r} (no backslashes, percent-encoding, spaces or "
                         "control characters)")
    segments = tuple(path.split("/"))
    for seg in segments:
        if seg == "":
            raise S3UriError(f"{label} has an empty segment ('//')")
        if seg in (".", ".."):
            raise S3UriError(f"{label} has a {seg!r} segment")
    return segments


def split_uri(uri: str) -> tuple[str, tuple[str, ...]]:
    """A checked ``s3://`` URI as (bucket, path segments); one trailing ``/`` is allowed
    (a prefix written as a folder). :class:`S3UriError` says what is wrong."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        scheme = uri.split("://", 1)[0] + "://" if isinstance(uri, str) and "://" in uri else None
        raise S3UriError(f"{uri!r} is not an s3:// URI" + (f" ({scheme} is refused)" if scheme else ""))
    bucket, sep, path = uri[len("s3://"):].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise S3UriError(f"{uri!r}: {bucket!r} is not a valid bucket name")
    if not sep or not path:
        return bucket, ()
    if path.startswith("/"):
        raise S3UriError(f"{uri!r} has an empty segment ('//')")
    path = path[:-1] if path.endswith("/") else path
    return bucket, check_key_path(path, what=repr(uri))


def check_uri(uri: str) -> str:
    """``uri`` unchanged if it is a plain ``s3://bucket/seg/...`` URI (see :func:`split_uri`)."""
    split_uri(uri)
    return uri


def is_within(uri: str, prefix: str) -> bool:
    """Whether ``uri`` is ``prefix`` or under it, compared by whole segments."""
    bucket, segs = split_uri(uri)
    p_bucket, p_segs = split_uri(prefix)
    return bucket == p_bucket and segs[: len(p_segs)] == p_segs


def check_allowed(uri: str, allowed_prefixes: Iterable[str]) -> str:
    """``uri`` unchanged if it is a plain s3:// URI under one of ``allowed_prefixes``;
    else :class:`S3UriError` saying which prefixes are allowed."""
    prefixes = list(allowed_prefixes)
    split_uri(uri)
    if not any(is_within(uri, p) for p in prefixes):
        raise S3UriError(f"{uri!r} is outside the allowed prefixes {prefixes} (object_store.allowed_prefixes)")
    return uri
