"""``s3://bucket/prefix`` URIs: one parser for every package (no package needs
``weight_streaming`` just to split a URI)."""

from __future__ import annotations


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
