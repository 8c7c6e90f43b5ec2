"""The IAM evaluator the enforcing moto server runs (tests.aws_iam): AWS's rules, so the
stack's IAM test can neither pass a widened policy nor refuse a narrow one."""

from __future__ import annotations

from tests.aws_iam import Ask, allowed

ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
TAGGED = {"ec2:ResourceTag/thaw:cluster": ["prod"]}


def policy(*statements: dict) -> list[dict]:
    return [{"Version": "2012-10-17", "Statement": list(statements)}]


def allow(action: str = "ec2:TerminateInstances", resource: str = "arn:aws:ec2:*:*:instance/*", **extra: object) -> dict:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def test_an_allow_needs_its_action_resource_and_every_condition() -> None:
    only_prod = allow(Condition={"StringEquals": {"ec2:ResourceTag/thaw:cluster": "prod"}})
    assert allowed(policy(only_prod), Ask("ec2:TerminateInstances", ARN, TAGGED))
    assert allowed(policy(only_prod), Ask("EC2:terminateinstances", ARN, TAGGED))  # actions ignore case
    assert not allowed(policy(only_prod), Ask("ec2:StopInstances", ARN, TAGGED))
    assert not allowed(policy(only_prod), Ask("ec2:TerminateInstances", "arn:aws:ec2:*:*:volume/v-1", TAGGED))
    assert not allowed(policy(only_prod), Ask("ec2:TerminateInstances", ARN, {
        "ec2:ResourceTag/thaw:cluster": ["staging"]}))
    # A key the request does not carry: the condition is false (not an error, not true).
    assert not allowed(policy(only_prod), Ask("ec2:TerminateInstances", ARN))
    if_exists = allow(Condition={"StringEqualsIfExists": {"ec2:ResourceTag/thaw:cluster": "prod"}})
    assert allowed(policy(if_exists), Ask("ec2:TerminateInstances", ARN))


def test_a_failed_condition_is_no_allow_and_not_a_deny() -> None:
    # moto's own evaluator turns it into a Deny, which would refuse what another statement allows.
    narrow = allow(Condition={"StringEquals": {"ec2:ResourceTag/thaw:cluster": "prod"}})
    assert allowed(policy(narrow, allow()), Ask("ec2:TerminateInstances", ARN))


def test_an_explicit_deny_wins() -> None:
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
    get = allow("s3:GetObject", "arn:aws:s3:::b/models/*")
    assert allowed(policy(get, deny), Ask("s3:GetObject", "arn:aws:s3:::b/models/m/x"))
    assert not allowed(policy(get, deny), Ask("s3:GetObject", "arn:aws:s3:::b/models/m/x",
                                              {"aws:SecureTransport": ["false"]}))


def test_wildcards_and_like_operators() -> None:
    tokenizer = allow("s3:GetObject", "arn:aws:s3:::b/models/*/tokenizer*")
    assert allowed(policy(tokenizer), Ask("s3:GetObject", "arn:aws:s3:::b/models/demo/tokenizer_config.json"))
    assert not allowed(policy(tokenizer), Ask("s3:GetObject", "arn:aws:s3:::b/models/demo/model.safetensors"))
    listing = allow("s3:ListBucket", "arn:aws:s3:::b", Condition={"StringLike": {"s3:prefix": "usage/*"}})
    assert allowed(policy(listing), Ask("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["usage/a/"]}))
    assert not allowed(policy(listing), Ask("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["models/"]}))
    assert not allowed(policy(listing), Ask("s3:ListBucket", "arn:aws:s3:::b"))
    # HeadBucket is authorized as ListBucket.
    assert allowed(policy(allow("s3:ListBucket", "arn:aws:s3:::b")), Ask("s3:HeadBucket", "arn:aws:s3:::b"))
