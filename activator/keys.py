"""The API keys this activator was last sent by the controller, kept on its own disk.

The controller owns the key table (``warm_pool.keys``); the activator fetches it when
the route table's ``keys_version`` moves and applies it at once. It also writes what it
received to ``<data_dir>/activators/<id>/keys.json`` (mode 0600, hashes only), so a
restart while the controller is away neither loses a key nor forgets a revocation.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from thaw.log import get_logger
from thaw.wire import KeyTable

log = get_logger()

KEYS_FILE = "keys.json"


def split(table: KeyTable) -> tuple[dict[bytes, str], set[bytes]]:
    """(active key hash -> tenant, revoked hashes), for the authenticator."""
    active: dict[bytes, str] = {}
    revoked: set[bytes] = set()
    for k in table.keys:
        if k.revoked_at is None:
            active[bytes.fromhex(k.hash)] = k.tenant
        else:
            revoked.add(bytes.fromhex(k.hash))
    return active, revoked


class KeyCache:
    def __init__(self, directory: Path) -> None:
        self.path = directory / KEYS_FILE

    def load(self) -> KeyTable | None:
        """The last table received, or None (none yet, or unreadable: said in the log)."""
        try:
            return KeyTable.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            log.warning("key_cache_unreadable", path=str(self.path), error=str(exc))
            return None

    def save(self, table: KeyTable) -> None:
        """Written whole and renamed into place: a crash leaves the old table or the new."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(table.model_dump_json().encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
