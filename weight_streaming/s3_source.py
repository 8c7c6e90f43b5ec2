"""A :class:`~weight_streaming.sources.RangeSource` over one S3 object, read with ranged GETs.

Takes a ready boto3/botocore client (sync) so this module imports nothing from
boto3 itself: building the client, its endpoint and its connection pool size
(``botocore.config.Config(max_pool_connections=...)`` should be at least the
streamer's ``concurrency``) is the caller's business. boto3 clients are safe to
share between threads, which is how the streamer uses them.
"""

from __future__ import annotations

from typing import Any

from weight_streaming.sources import StreamError, check_range

# A body that breaks off mid-transfer (connection reset, read timeout) is not retried
# by botocore, which only retries the request itself: resume from where it stopped.
_BODY_ATTEMPTS = 3


class S3RangeSource:
    """``s3://bucket/key`` as a range source; each ``read_into`` is one ranged GET."""

    def __init__(self, client: Any, bucket: str, key: str, *, size: int | None = None) -> None:
        self._client = client
        self.bucket = bucket
        self.key = key
        self._size = size

    def size(self) -> int:
        if self._size is None:
            head = self._client.head_object(Bucket=self.bucket, Key=self.key)
            self._size = int(head["ContentLength"])
        return self._size

    def read_into(self, offset: int, view: memoryview) -> None:
        mv = memoryview(view).cast("B")
        n = len(mv)
        check_range(offset, n, self.size(), repr(self))
        done = 0
        failures = 0
        while done < n:
            got, err = self._get_into(offset + done, mv[done:])
            done += got
            if done < n:
                failures += 1
                if failures >= _BODY_ATTEMPTS:
                    raise StreamError(
                        f"{self!r}: short read: got {done} of {n} bytes at offset {offset} "
                        f"after {failures} attempts ({err!r})"
                    ) from err

    def _get_into(self, offset: int, mv: memoryview) -> tuple[int, Exception | None]:
        """One GET for ``[offset, offset + len(mv))``: bytes written and, if the body broke off, why."""
        n = len(mv)
        try:
            # botocore already retried the request itself; a failure here is final.
            resp = self._client.get_object(
                Bucket=self.bucket, Key=self.key, Range=f"bytes={offset}-{offset + n - 1}"
            )
        except Exception as exc:
            raise StreamError(f"{self!r}: ranged GET at offset {offset} failed: {exc!r}") from exc
        length = int(resp.get("ContentLength", n))
        if length != n:
            resp["Body"].close()
            raise StreamError(
                f"{self!r}: asked for {n} bytes at offset {offset}, the server sent {length}"
            )
        body = resp["Body"]
        got = 0
        try:
            while got < n:
                # readinto fills our buffer directly (botocore's StreamingBody is an io.IOBase).
                k = body.readinto(mv[got:])
                if not k:
                    break
                got += k
        except Exception as exc:  # connection reset / read timeout mid-body: resume
            return got, exc
        finally:
            body.close()
        return got, None

    def __repr__(self) -> str:
        return f"S3RangeSource('s3://{self.bucket}/{self.key}')"
