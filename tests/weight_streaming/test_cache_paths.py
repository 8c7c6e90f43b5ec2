"""Names from the store never choose where a worker writes: a cache entry's file name
is derived (hashes and a sanitised basename), and a manifest that names a file outside
its model's prefix is refused when it is read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from weight_streaming.cache import DiskCache, entry_name
from weight_streaming.manifest import Manifest

HOSTILE_KEYS = [
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    ".",
    "models/demo/..",
    "a/../../../../tmp/x",
    "..\\..\\windows\\x",
    "%2e%2e/%2e%2e/x",
    "x\x00y",
    "a b/c\nd",
    "",
    "models/" + "z" * 500,
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_an_entry_name_is_one_safe_component(key: str) -> None:
    name = entry_name("thaw", key, '"etag"')
    assert "/" not in name and name not in (".", "..") and len(name) <= 20 + 1 + 12 + 1 + 80
    assert re.fullmatch(r"[0-9a-f]{20}-[0-9a-f]{12}-[A-Za-z0-9._-]+", name), name


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_a_hostile_key_is_cached_inside_the_cache_dir(tmp_path: Path, key: str) -> None:
    root = tmp_path / "cache"
    cache = DiskCache(root, max_bytes=1000)
    w = cache.begin("thaw", key, "e1", 3)
    assert w is not None
    w.write(0, b"abc")
    w.commit().result()
    cache.record_model(f"s3://thaw/{key}", [("thaw", key, "e1", 3)])
    path = cache.lookup("thaw", key, "e1", 3)
    assert path is not None and path.parent == root and path.read_bytes() == b"abc"
    # Everything written is under the cache dir, and nothing else was written anywhere.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    for p in root.rglob("*"):
        assert p.resolve().is_relative_to(root.resolve()) and not p.is_symlink()
    cache.close()


def _manifest(path: str) -> str:
    return json.dumps({"uri": "s3://thaw/models/demo", "created_at": "2025-01-01T00:00:00Z",
                       "files": [{"path": path, "size": 1, "sha256": "0" * 64, "etag": "e"}],
                       "safetensors": {}, "parameter_count": 0, "total_bytes": 1})


@pytest.mark.parametrize("path", ["../../etc/x", "/etc/x", "a/../../b", "a//b", "./x", "%2e%2e/x", "a\\..\\b", ""])
def test_a_manifest_naming_a_file_outside_its_model_is_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="file path"):
        Manifest.model_validate_json(_manifest(path))


def test_a_manifest_with_plain_relative_paths_is_read() -> None:
    assert Manifest.model_validate_json(_manifest("sub/model.safetensors")).files[0].path == "sub/model.safetensors"
