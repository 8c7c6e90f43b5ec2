"""The Files API's index (warm_pool.batch.files) on the state database: a file is its tenant's
only, pages run by creation time in either order with ``after`` as the cursor, and a
removal says what it removed."""

from __future__ import annotations

import pytest

from thaw.wire import NewFile
from warm_pool.batch.files import FileExists, FileIndex
from warm_pool.db import Db


def new(i: int, tenant: str = "acme", purpose: str = "batch") -> NewFile:
    return NewFile(id=f"file-{i:08d}", tenant=tenant, filename=f"f{i}.jsonl", purpose=purpose,  # type: ignore[arg-type]
                   bytes=10 * i, lines=i, key=f"files/{tenant}/file-{i:08d}")


@pytest.fixture
def index() -> FileIndex:
    return FileIndex(Db.sqlite(None))


def test_a_file_is_its_tenants_only(index: FileIndex) -> None:
    made = index.add(new(1), at=100.0)
    assert made.created_at == 100.0 and index.get("acme", "file-00000001") == made
    assert index.get("other", "file-00000001") is None
    assert index.remove("other", "file-00000001") is None
    assert index.list("other").data == []
    with pytest.raises(FileExists):
        index.add(new(1), at=101.0)
    assert index.remove("acme", "file-00000001") == made
    assert index.get("acme", "file-00000001") is None and index.remove("acme", "file-00000001") is None


def test_pages_by_creation_time_with_after_as_the_cursor(index: FileIndex) -> None:
    for i in range(1, 6):
        index.add(new(i), at=100.0 + (i // 2))  # 1: 100, 2-3: 101, 4-5: 102 (ties by id)
    index.add(new(9, tenant="other"), at=100.5)
    index.add(new(7, purpose="batch_output"), at=103.0)
    newest = index.list("acme", limit=3)
    assert [f.id[-1] for f in newest.data] == ["7", "5", "4"] and newest.has_more
    rest = index.list("acme", limit=3, after=newest.data[-1].id)
    assert [f.id[-1] for f in rest.data] == ["3", "2", "1"] and not rest.has_more
    oldest = index.list("acme", order="asc", limit=2)
    assert [f.id[-1] for f in oldest.data] == ["1", "2"] and oldest.has_more
    assert [f.id[-1] for f in index.list("acme", order="asc", after="file-00000002").data] == ["3", "4", "5", "7"]
    assert [f.id[-1] for f in index.list("acme", purpose="batch_output").data] == ["7"]
    # A cursor that is not the tenant's file: from the beginning.
    assert len(index.list("acme", after="file-00000009").data) == 6
