"""Hostile snapshot archives: each is refused with nothing written outside the
destination, by each of the two defences alone (``check_member``, and tarfile's
``data`` filter behind it), so that losing either one is caught here."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from snapshotter import archive
from snapshotter.archive import (
    ArchiveError,
    CorruptArchive,
    UnsafeArchive,
    check_member,
    extract_archive,
)
from thaw.units import MiB


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for m, data in members:
            if m.isfile():
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data) if m.isfile() else None)
    return buf.getvalue()


def _m(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = linkname
    m.mode = 0o644
    return m


def _ok() -> tuple[tarfile.TarInfo, bytes]:
    return _m("torch_compile_cache/ok"), b"ok"


# Each case: the members, built for a given "outside" directory (absolute targets).
Case = Callable[[Path], list[tuple[tarfile.TarInfo, bytes]]]
CASES: dict[str, Case] = {
    "absolute-path": lambda out: [_ok(), (_m(f"{out}/evil"), b"evil")],
    "dotdot": lambda out: [_ok(), (_m("../outside/evil"), b"evil")],
    "dotdot-in-the-middle": lambda out: [_ok(), (_m("torch_compile_cache/../../outside/evil"), b"evil")],
    "symlink-to-absolute-outside": lambda out: [_ok(), (_m("torch_compile_cache/l", tarfile.SYMTYPE, str(out)), b"")],
    "symlink-to-relative-outside": lambda out: [_ok(), (_m("torch_compile_cache/l", tarfile.SYMTYPE, "../../outside"),
                                                        b"")],
    # The classic: a link to outside, then a file written through it.
    "symlink-then-write-through-it": lambda out: [
        _ok(), (_m("torch_compile_cache/l", tarfile.SYMTYPE, str(out)), b""),
        (_m("torch_compile_cache/l/evil"), b"evil")],
    "relative-symlink-then-write-through-it": lambda out: [
        _ok(), (_m("l", tarfile.SYMTYPE, "../outside"), b""), (_m("l/evil"), b"evil")],
    "hardlink-to-outside": lambda out: [_ok(), (_m("torch_compile_cache/h", tarfile.LNKTYPE, f"{out}/target"), b"")],
    "hardlink-dotdot": lambda out: [_ok(), (_m("torch_compile_cache/h", tarfile.LNKTYPE, "../outside/target"), b"")],
    "char-device": lambda out: [_ok(), (_m("torch_compile_cache/dev", tarfile.CHRTYPE), b"")],
    "block-device": lambda out: [_ok(), (_m("torch_compile_cache/dev", tarfile.BLKTYPE), b"")],
    "fifo": lambda out: [_ok(), (_m("torch_compile_cache/fifo", tarfile.FIFOTYPE), b"")],
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the destination, with a file a hard link could target."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "target").write_bytes(b"precious")
    return out


def _outside_untouched(tmp_path: Path, outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["target"]
    assert (outside / "target").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "dest", "outside"]


def _only_inside(dest: Path) -> None:
    for p in dest.rglob("*"):
        assert not p.is_symlink() and (p.is_dir() or p.is_file()), p
        assert p.resolve().is_relative_to(dest.resolve()), p


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_archive_is_refused_and_writes_nothing_outside(tmp_path: Path, outside: Path, case: str) -> None:
    (tmp_path / "bad.tar.gz").write_bytes(_tar(CASES[case](outside)))
    with pytest.raises(UnsafeArchive):
        extract_archive(tmp_path / "bad.tar.gz", tmp_path / "dest", max_bytes=MiB)
    _outside_untouched(tmp_path, outside)
    _only_inside(tmp_path / "dest")


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_member_alone_refuses_each(tmp_path: Path, outside: Path, case: str) -> None:
    members = [m for m, _ in CASES[case](outside)]
    with pytest.raises(UnsafeArchive):
        for m in members:
            check_member(m)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_data_filter_alone_keeps_each_inside(tmp_path: Path, outside: Path, case: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Without check_member, tarfile's filter still refuses what would leave the
    # destination; what it lets through (an absolute name made relative) stays inside.
    monkeypatch.setattr(archive, "check_member", lambda m: None)
    (tmp_path / "bad.tar.gz").write_bytes(_tar(CASES[case](outside)))
    try:
        extract_archive(tmp_path / "bad.tar.gz", tmp_path / "dest", max_bytes=MiB)
    except UnsafeArchive:
        pass
    _outside_untouched(tmp_path, outside)
    _only_inside(tmp_path / "dest")


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_member_alone_keeps_each_inside(tmp_path: Path, outside: Path, case: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the data filter (every member trusted), check_member still refuses all.
    real = tarfile.TarFile.extract

    def trusting(self: tarfile.TarFile, member: tarfile.TarInfo, path: str = "", **kw: object) -> None:
        kw["filter"] = "fully_trusted"
        real(self, member, path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tarfile.TarFile, "extract", trusting)
    (tmp_path / "bad.tar.gz").write_bytes(_tar(CASES[case](outside)))
    with pytest.raises(UnsafeArchive, match="absolute path|leaves the destination|is a link|device, FIFO"):
        extract_archive(tmp_path / "bad.tar.gz", tmp_path / "dest", max_bytes=MiB)
    _outside_untouched(tmp_path, outside)
    _only_inside(tmp_path / "dest")


def test_a_decompression_bomb_is_refused_before_it_is_written(tmp_path: Path) -> None:
    # 64 MiB of zeros gzip to ~64 KiB; the manifest declared 1 MiB unpacked.
    bomb = _m("torch_compile_cache/bomb")
    (tmp_path / "bad.tar.gz").write_bytes(_tar([_ok(), (bomb, bytes(64 * MiB))]))
    assert (tmp_path / "bad.tar.gz").stat().st_size < MiB
    with pytest.raises(CorruptArchive, match=f"more than the {MiB} bytes declared"):
        extract_archive(tmp_path / "bad.tar.gz", tmp_path / "dest", max_bytes=MiB)
    # The bomb's header was enough: not a byte of it was written.
    assert not (tmp_path / "dest/torch_compile_cache/bomb").exists()
    assert sum(p.stat().st_size for p in (tmp_path / "dest").rglob("*") if p.is_file()) == 2


def test_many_small_members_add_up_to_the_cap(tmp_path: Path) -> None:
    members = [(_m(f"torch_compile_cache/f{i}"), bytes(100 * 1024)) for i in range(20)]  # 20 x 100 KiB
    (tmp_path / "bad.tar.gz").write_bytes(_tar(members))
    with pytest.raises(CorruptArchive):
        extract_archive(tmp_path / "bad.tar.gz", tmp_path / "dest", max_bytes=MiB)
    # 10 x 100 KiB fit in 1 MiB (1,024,000 <= 1,048,576); the 11th does not, and is not written.
    assert len([p for p in (tmp_path / "dest").rglob("*") if p.is_file()]) == 10


def test_unsafe_archive_is_an_archive_error() -> None:
    assert issubclass(UnsafeArchive, ArchiveError) and issubclass(CorruptArchive, ArchiveError)
