"""API key → tenant. Keys exist only as sha256 hashes, looked up by the hash of the key
presented (one dict lookup, however many keys there are)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from activator.errors import NotFound, Unauthorized
from thaw.config import Model, RateLimits, Tenant, ThawConfig


@dataclass(frozen=True)
class Principal:
    tenant: str
    allowed_models: frozenset[str]
    limits: RateLimits = RateLimits()
    # Models private to other tenants (``models[].tenant``): never this tenant's to use;
    # its own private models are its to use whatever allowed_models says.
    others_private: frozenset[str] = frozenset()
    own_private: frozenset[str] = frozenset()

    def may_use(self, model_name: str) -> bool:
        return model_name not in self.others_private and (
            model_name in self.own_private or "*" in self.allowed_models or model_name in self.allowed_models)


class Authenticator:
    def __init__(self, tenants: list[Tenant], models: list[Model] | None = None) -> None:
        self._active: dict[bytes, str] = {}
        self._revoked: set[bytes] = set()
        self.update_catalog(tenants, models or [])

    def update_catalog(self, tenants: list[Tenant], models: list[Model]) -> None:
        """The tenants and models in force (the config's, then the controller's catalog)."""
        private = [(m.name, m.tenant) for m in models if m.tenant is not None]
        self._tenants = {t.name: Principal(t.name, frozenset(t.allowed_models), t.limits,
                                           frozenset(n for n, owner in private if owner != t.name),
                                           frozenset(n for n, owner in private if owner == t.name))
                         for t in tenants}
        self._config_entries: dict[bytes, Principal] = {}
        for t in tenants:
            for h in t.api_key_hashes:
                self._config_entries[bytes.fromhex(h.removeprefix("sha256:"))] = self._tenants[t.name]
        self.update_dynamic(self._active, self._revoked)

    def update_dynamic(self, active: dict[bytes, str], revoked: set[bytes]) -> None:
        """Apply the key table (`thaw tenants keys add|revoke`): new keys work, revoked ones stop."""
        self._active, self._revoked = active, revoked
        entries = {h: p for h, p in self._config_entries.items() if h not in revoked}
        entries.update({h: self._tenants[t] for h, t in active.items() if t in self._tenants and h not in revoked})
        self._entries = entries

    @classmethod
    def from_config(cls, cfg: ThawConfig) -> Authenticator:
        return cls(cfg.tenants, cfg.models)

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
