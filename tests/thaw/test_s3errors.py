"""The one table of S3 error codes (thaw/s3errors.py), read off real answers from the
embedded SeaweedFS (GET and HEAD, a missing bucket, wrong credentials, a stale ETag,
a bucket created twice) and off errors that are no answer at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import botocore.exceptions
import pytest

from thaw.objstore import S3Endpoint
from thaw.s3errors import S3Failure, classify, error_code, error_message, is_missing_key
from thaw.s3uri import parse_s3_uri


def answer(call: Callable[[], Any]) -> botocore.exceptions.ClientError:
    with pytest.raises(botocore.exceptions.ClientError) as e:
        call()
    return e.value


def test_real_answers_are_classified(s3: S3Endpoint, s3_prefix: str) -> None:
    bucket, prefix = parse_s3_uri(s3_prefix)
    c = s3.client()
    key = f"{prefix}/obj"
    c.put_object(Bucket=bucket, Key=key, Body=b"x")
    missing_get = answer(lambda: c.get_object(Bucket=bucket, Key=f"{prefix}/none"))
    missing_head = answer(lambda: c.head_object(Bucket=bucket, Key=f"{prefix}/none"))  # no body: "404"
    assert is_missing_key(missing_get) and is_missing_key(missing_head)
    assert error_code(missing_head) == "404"
    assert classify(answer(lambda: c.get_object(Bucket="no-such-bucket-here", Key="k"))) is S3Failure.NO_BUCKET
    stale = answer(lambda: c.get_object(Bucket=bucket, Key=key, IfMatch='"0123456789abcdef"'))
    assert classify(stale) is S3Failure.CHANGED
    bad = S3Endpoint(s3.endpoint_url, s3.access_key, "wrong-secret", s3.region).client()
    denied = answer(lambda: bad.get_object(Bucket=bucket, Key=key))
    assert classify(denied) is S3Failure.DENIED and not is_missing_key(denied)
    assert error_message(denied)
    again = answer(lambda: c.create_bucket(Bucket=bucket))
    assert classify(again) is S3Failure.BUCKET_EXISTS


def test_what_is_not_an_answer_is_not_classified() -> None:
    refused = botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert classify(refused) is None and error_code(refused) is None and not is_missing_key(refused)
    assert classify(ValueError("x")) is None
    odd = botocore.exceptions.ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "GetObject")
    assert classify(odd) is S3Failure.OTHER and error_message(odd) == "boom"
