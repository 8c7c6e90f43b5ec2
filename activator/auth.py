"""API key → tenant. Keys exist only as sha256 hashes, looked up by the hash of the key
presented (one dict lookup, however many keys there are)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from activator.errors import NotFound, Unauthorized
from thaw.config import RateLimits, Tenant, ThawConfig


@dataclass(frozen=True)
class Principal:
    tenant: str
    allowed_models: frozenset[str]
    limits: RateLimits = RateLimits()

    def may_use(self, model_name: str) -> bool:
        return "*" in self.allowed_models or model_name in self.allowed_models


class Authenticator:
    def __init__(self, tenants: list[Tenant]) -> None:
        self._tenants = {t.name: Principal(t.name, frozenset(t.allowed_models), t.limits) for t in tenants}
        self._config_entries: dict[bytes, Principal] = {}
        for t in tenants:
            for h in t.api_key_hashes:
                self._config_entries[bytes.fromhex(h.removeprefix("sha256:"))] = self._tenants[t.name]
        self._entries = dict(self._config_entries)

    def update_dynamic(self, active: dict[bytes, str], revoked: set[bytes]) -> None:
        """Apply the key table (`thaw tenants add|revoke`): new keys work, revoked ones stop."""
        entries = {h: p for h, p in self._config_entries.items() if h not in revoked}
        entries.update({h: self._tenants[t] for h, t in active.items() if t in self._tenants and h not in revoked})
        self._entries = entries

    @classmethod
    def from_config(cls, cfg: ThawConfig) -> Authenticator:
        return cls(cfg.tenants)

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        # Looked up by the key's sha256: the time a lookup takes depends on that digest,
        # which says nothing about any stored key (finding a key from it is a preimage).
        found = self._entries.get(hashlib.sha256(key.strip().encode()).digest())
        if found is None:
            raise Unauthorized("invalid API key")
        return found


def check_model_access(principal: Principal, model_name: str, requested: str) -> None:
    """A model the tenant may not use answers exactly like one that does not exist."""
    if not principal.may_use(model_name):
        raise NotFound(f"the model {requested!r} does not exist", param="model")
