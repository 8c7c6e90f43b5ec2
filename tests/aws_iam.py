"""A moto server that enforces IAM the way AWS does for the calls Thaw makes.

moto's own authorization (``INITIAL_NO_AUTH_ACTION_COUNT``) checks the signature and the
action, but for EC2 and Secrets Manager it evaluates every call against the resource
``*`` and supplies no condition keys, and it turns an Allow whose condition is not met
into an explicit Deny. A policy scoped to one secret, to one cluster's tagged instances
or to the stack's launch templates is then refused everything, and a widened one cannot
be told from a narrow one. This module replaces moto's check (in the server process
only) with an evaluator of AWS's documented rules for the requests Thaw's services make:

- each request is one or more asks (action, resource ARN, condition context): S3 as moto
  names the object or bucket (with ``s3:prefix`` for a listing); a secret by its ARN;
  ``RunInstances`` for each resource it touches (the launch template, image, subnet,
  security groups and network interface under ``ec2:LaunchTemplate``; the new instance
  and volume under ``aws:RequestTag/*`` too), plus ``ec2:CreateTags`` for tags at launch
  (``ec2:CreateAction``) and ``iam:PassRole`` for the launch template's instance profile
  (``iam:PassedToService``); stop, start and terminate for each instance by its ARN with
  its tags as ``ec2:ResourceTag/*`` and ``aws:ResourceTag/*``;
- an ask is allowed when some statement of the caller's policies allows it and none
  denies it; a statement applies when its action, resource and every condition match; a
  condition on a key the request does not carry is false (true for the ``...IfExists``
  and negated operators), as in AWS.

The account's own credentials (:data:`ADMIN_KEY`, the test harness acting as the
account owner) skip the check; every other access key is an IAM user's, and its user's
policies decide. Run the server with ``python -m tests.aws_iam PORT``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

ADMIN_KEY = "testing"

# Actions whose permission AWS names differently from the operation.
_PERMISSION = {"s3:HeadBucket": "s3:ListBucket", "s3:ListBucketV2": "s3:ListBucket"}


@dataclass(frozen=True)
class Ask:
    """One permission a request needs: an action on a resource, with its condition keys."""

    action: str
    resource: str
    context: Mapping[str, list[str]] = field(default_factory=dict)


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _glob(pattern: str, value: str, *, fold: bool = False) -> bool:
    if fold:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _condition(op: str, key: str, wanted: Any, context: Mapping[str, list[str]]) -> bool:
    wanted = [str(w).lower() if isinstance(w, bool) else str(w) for w in _as_list(wanted)]
    present = {k.lower(): v for k, v in context.items()}.get(key.lower())
    quantifier = ""
    if ":" in op and op.split(":", 1)[0] in ("ForAnyValue", "ForAllValues"):
        quantifier, op = op.split(":", 1)
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    negated = "Not" in op
    if present is None:
        return if_exists or negated or quantifier == "ForAllValues"
    base = op.replace("Not", "")

    def one(value: str) -> bool:
        if base in ("StringEquals", "ArnEquals"):
            hit = value in wanted
        elif base in ("StringLike", "ArnLike"):
            hit = any(_glob(w, value) for w in wanted)
        elif base == "StringEqualsIgnoreCase":
            hit = value.lower() in [w.lower() for w in wanted]
        elif base == "Bool":
            hit = value.lower() in wanted
        else:
            raise ValueError(f"condition operator {op!r} is not evaluated here")
        return not hit if negated else hit

    if quantifier == "ForAllValues":
        return all(one(v) for v in present)
    return any(one(v) for v in present)


def statement_applies(st: Mapping[str, Any], ask: Ask) -> bool:
    action = _PERMISSION.get(ask.action, ask.action)
    if "Action" in st:
        if not any(_glob(a, action, fold=True) for a in _as_list(st["Action"])):
            return False
    elif any(_glob(a, action, fold=True) for a in _as_list(st.get("NotAction", []))):
        return False
    if "Resource" in st:
        if not any(_glob(r, ask.resource) for r in _as_list(st["Resource"])):
            return False
    elif any(_glob(r, ask.resource) for r in _as_list(st.get("NotResource", []))):
        return False
    for op, keys in (st.get("Condition") or {}).items():
        for key, wanted in keys.items():
            if not _condition(op, key, wanted, ask.context):
                return False
    return True


def allowed(policies: Iterable[Mapping[str, Any]], ask: Ask) -> bool:
    """AWS's rule for identity policies: an explicit Deny wins, then any Allow, else no."""
    allow = False
    for doc in policies:
        for st in _as_list(doc.get("Statement", [])):
            if statement_applies(st, ask):
                if st.get("Effect") == "Deny":
                    return False
                allow = True
    return allow


# -- the asks each request makes (server side: reads moto's backends) ---------------------


def _param(data: Mapping[str, Any], name: str) -> str | None:
    v = data.get(name)
    if isinstance(v, list):
        return str(v[0]) if v else None
    return None if v is None else str(v)


def _indexed(data: Mapping[str, Any], prefix: str) -> list[str]:
    """``InstanceId.1``, ``InstanceId.2``, ... in order."""
    pat = re.compile(re.escape(prefix) + r"\.(\d+)$")
    found = sorted((int(m.group(1)), _param(data, k)) for k in data if (m := pat.match(k)))
    return [v for _, v in found if v is not None]


def _tag_specs(data: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(1, 20):
        rtype = _param(data, f"TagSpecification.{i}.ResourceType")
        if rtype is None:
            break
        tags = out.setdefault(rtype, {})
        for j in range(1, 60):
            key = _param(data, f"TagSpecification.{i}.Tag.{j}.Key")
            if key is None:
                break
            tags[key] = _param(data, f"TagSpecification.{i}.Tag.{j}.Value") or ""
    return out


def _request_tags(tags: Mapping[str, str]) -> dict[str, list[str]]:
    ctx = {f"aws:RequestTag/{k}": [v] for k, v in tags.items()}
    if tags:
        ctx["aws:TagKeys"] = list(tags)
    return ctx


def ec2_asks(action: str, data: Mapping[str, Any], account: str, region: str) -> list[Ask]:
    from moto.ec2.models import ec2_backends
    from moto.iam.models import iam_backends

    backend = ec2_backends[account][region]
    arn = f"arn:aws:ec2:{region}:{account}"
    if action in ("ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances"):
        asks = []
        for instance_id in _indexed(data, "InstanceId"):
            tags = dict(backend.tags.get(instance_id, {}))
            ctx = {f"{p}:ResourceTag/{k}": [v] for k, v in tags.items() for p in ("aws", "ec2")}
            asks.append(Ask(action, f"{arn}:instance/{instance_id}", ctx))
        return asks
    if action != "ec2:RunInstances":
        return [Ask(action, "*")]
    lt_id = _param(data, "LaunchTemplate.LaunchTemplateId")
    lt_name = _param(data, "LaunchTemplate.LaunchTemplateName")
    template = (backend.get_launch_template(lt_id) if lt_id else
                backend.get_launch_template_by_name(lt_name) if lt_name else None)
    lt_data: dict[str, Any] = {}
    common: dict[str, list[str]] = {}
    resources = [f"{arn}:network-interface/*"]
    if template is not None:
        lt_data = template.default_version().data
        common["ec2:LaunchTemplate"] = [f"{arn}:launch-template/{template.id}"]
        resources.append(f"{arn}:launch-template/{template.id}")
    image = _param(data, "ImageId") or lt_data.get("ImageId")
    if image:
        resources.append(f"arn:aws:ec2:{region}::image/{image}")
    subnet = _param(data, "SubnetId") or lt_data.get("SubnetId")
    if subnet:
        resources.append(f"{arn}:subnet/{subnet}")
    groups = _indexed(data, "SecurityGroupId") or _as_list(lt_data.get("SecurityGroupIds", []))
    resources += [f"{arn}:security-group/{g}" for g in groups]
    if _param(data, "InstanceMarketOptions.MarketType") == "spot":
        resources.append(f"{arn}:spot-instances-request/*")
    asks = [Ask(action, r, common) for r in resources]
    specs = _tag_specs(data)
    for rtype in ("instance", "volume"):
        tags = specs.get(rtype, {})
        asks.append(Ask(action, f"{arn}:{rtype}/*", {**common, **_request_tags(tags)}))
        if tags:
            asks.append(Ask("ec2:CreateTags", f"{arn}:{rtype}/*",
                            {"ec2:CreateAction": ["RunInstances"], **_request_tags(tags)}))
    profile = _param(data, "IamInstanceProfile.Arn") or (lt_data.get("IamInstanceProfile") or {}).get("Arn")
    if profile:
        iam = iam_backends[account]["aws"]
        for role in iam.get_instance_profile_by_arn(profile).roles:
            asks.append(Ask("iam:PassRole", role.arn, {"iam:PassedToService": ["ec2.amazonaws.com"]}))
    return asks


def secret_asks(action: str, body: Any, account: str, region: str) -> list[Ask]:
    from moto.secretsmanager.models import secretsmanager_backends

    try:
        secret_id = json.loads(body or "{}").get("SecretId")
    except ValueError:
        secret_id = None
    if not secret_id:
        return [Ask(action, "*")]
    try:
        secret_arn = secretsmanager_backends[account][region].describe_secret(secret_id).arn
    except Exception:  # noqa: BLE001 - an unknown secret: AWS authorizes against the name's ARN
        secret_arn = f"arn:aws:secretsmanager:{region}:{account}:secret:{secret_id}"
    return [Ask(action, secret_arn)]


def install() -> None:
    """Put the evaluator in place of moto's check (in this process)."""
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMPolicy
    def check(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        auth = self.headers.get("Authorization") or ""
        key = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else ""
        if key == ADMIN_KEY or not auth:
            return
        uri = urlsplit(self.uri)
        path = self.raw_path + (f"?{uri.query}" if uri.query else "")
        request = iam_request_cls(account_id=self.current_account, method=self.method, path=path, data=self.data,
                                  body=self.raw_body, headers=self.headers, action=self._get_action())
        request.check_signature()
        action = request._action
        if action == "sts:GetCallerIdentity":
            return
        service = action.split(":", 1)[0]
        region = request._region
        if service == "ec2":
            asks = ec2_asks(action, self.data, self.current_account, region)
        elif service == "secretsmanager":
            asks = secret_asks(action, self.body, self.current_account, region)
        elif service == "s3":
            prefix = parse_qs(uri.query).get("prefix")
            asks = [Ask(action, resource, {"s3:prefix": prefix} if prefix else {})]
        else:
            asks = [Ask(action, resource)]
        # moto's own reading of each policy (inline, attached, the user's groups').
        policies = [IAMPolicy(p)._policy_json for p in request._access_key.collect_policies()]
        for ask in asks:
            if not allowed(policies, ask):
                sys.stderr.write(f"iam: denied {key} {ask}\n")
                request._raise_access_denied()

    ActionAuthenticatorMixin._authenticate_and_authorize_action = check  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    import os

    # Turn moto's authorization on (the check above is what it runs).
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    from moto import server, settings

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    install()
    server.main(["-H", "127.0.0.1", "-p", argv[0]])


if __name__ == "__main__":
    main(sys.argv[1:])
