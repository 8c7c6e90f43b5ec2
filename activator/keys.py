"""The API keys this activator was last sent by the controller, kept on its own disk.

The controller owns the key table (``warm_pool.registry.keys``); the activator fetches it when
the route table's ``keys_version`` moves and applies it at once. It also writes what it
received to ``<data_dir>/activators/<id>/keys.json`` (mode 0600, hashes only), so a
restart while the controller is away neither loses a key nor forgets a revocation.
The catalog (the models and tenants in force, ``activator.catalog``) is kept the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from thaw.log import get_logger
from thaw.private_files import write_private
from thaw.wire import KeyTable

log = get_logger()

KEYS_FILE = "keys.json"
T = TypeVar("T", bound=BaseModel)


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


class TableCache(Generic[T]):
    """The last table of one kind the controller sent, in ``directory/name``."""

    def __init__(self, directory: Path, name: str, kind: type[T]) -> None:
        self.path = directory / name
        self._kind = kind

    def load(self) -> T | None:
        """The last table received, or None (none yet, or unreadable: said in the log)."""
        try:
            return self._kind.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            log.warning("table_cache_unreadable", path=str(self.path), error=str(exc))
            return None

    def save(self, table: T) -> None:
        """Written whole (0600, whatever the umask) and renamed into place: a crash
        leaves the old table or the new."""
        write_private(self.path, table.model_dump_json().encode())


class KeyCache(TableCache[KeyTable]):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory, KEYS_FILE, KeyTable)
