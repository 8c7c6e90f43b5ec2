"""The Files API's index: which tenant's file each id is, its name, purpose and size,
and where its bytes are in the object store, in the controller's state database.

The bytes themselves are the activators' business (they store an upload, then index it
here); the index is what makes a file exist for the API: listed, read, deleted, used by
a batch. A file is only ever its tenant's: another tenant's id reads as no file at all.
Blocking: the controller calls it from threads.
"""

from __future__ import annotations

from typing import Any, Literal

from thaw.wire import FileList, FileRecord, NewFile
from warm_pool.db import Db

MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    object_key TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, created_at, id)
""",
]

_COLUMNS = "id, tenant, filename, purpose, bytes, lines, object_key, created_at"
# OpenAI's bound on one page of GET /v1/files.
MAX_PAGE = 10_000


class FileExists(Exception):
    """An id indexed already (409: ids are made unique by whoever stores the bytes)."""


def _record(row: tuple[Any, ...]) -> FileRecord:
    fid, tenant, filename, purpose, size, lines, key, created_at = row
    return FileRecord(id=fid, tenant=tenant, filename=filename, purpose=purpose, bytes=size, lines=lines,
                      key=key, created_at=created_at)


class FileIndex:
    def __init__(self, db: Db) -> None:
        self.db = db
        db.migrate("files", MIGRATIONS)

    def add(self, new: NewFile, at: float) -> FileRecord:
        record = FileRecord(**new.model_dump(), created_at=at)
        with self.db.write() as tx:
            if tx.one("SELECT 1 FROM files WHERE id = ?", (new.id,)) is not None:
                raise FileExists(f"file {new.id!r} exists")
            tx.execute(f"INSERT INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                       (new.id, new.tenant, new.filename, new.purpose, new.bytes, new.lines, new.key, at))
        return record

    def get(self, tenant: str, file_id: str) -> FileRecord | None:
        with self.db.read() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM files WHERE id = ? AND tenant = ?",  # noqa: S608
                         (file_id, tenant))
        return _record(row) if row else None

    def list(self, tenant: str, *, purpose: str | None = None, after: str | None = None, limit: int = MAX_PAGE,
             order: Literal["asc", "desc"] = "desc") -> FileList:
        """One page of the tenant's files by creation time (then id), newest first by
        default; ``after``: the last id of the previous page (an id that is not the
        tenant's file starts from the beginning, as a cursor that no longer exists)."""
        where, params = ["tenant = ?"], [tenant]
        if purpose is not None:
            where.append("purpose = ?")
            params.append(purpose)
        with self.db.read() as tx:
            if after is not None:
                cursor = tx.one("SELECT created_at, id FROM files WHERE id = ? AND tenant = ?", (after, tenant))
                if cursor is not None:
                    op = "<" if order == "desc" else ">"
                    where.append(f"(created_at {op} ? OR (created_at = ? AND id {op} ?))")
                    params += [cursor[0], cursor[0], cursor[1]]
            direction = "DESC" if order == "desc" else "ASC"
            rows = tx.query(f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(where)} "  # noqa: S608
                            f"ORDER BY created_at {direction}, id {direction} LIMIT ?", (*params, limit + 1))
        return FileList(data=[_record(r) for r in rows[:limit]], has_more=len(rows) > limit)

    def remove(self, tenant: str, file_id: str) -> FileRecord | None:
        """Take the file out of the index (the caller deletes its bytes); None when the
        tenant has no such file."""
        with self.db.write() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM files WHERE id = ? AND tenant = ?",  # noqa: S608
                         (file_id, tenant))
            if row is None:
                return None
            tx.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return _record(row)
