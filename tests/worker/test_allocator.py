"""The allocator a CPU engine is started with (worker.allocator)."""

from __future__ import annotations

from pathlib import Path

from worker.__main__ import engine_preload
from worker.allocator import find_tcmalloc, with_preload


def test_preloaded_libraries_come_first_and_once() -> None:
    env = {"LD_PRELOAD": "/lib/libgomp.so.1 /lib/tc.so", "PATH": "/bin"}
    out = with_preload(env, ["/lib/tc.so"])
    assert out == {"LD_PRELOAD": "/lib/tc.so:/lib/libgomp.so.1", "PATH": "/bin"}
    assert env["LD_PRELOAD"] == "/lib/libgomp.so.1 /lib/tc.so"  # the caller's mapping is not changed
    assert with_preload({"PATH": "/bin"}, ["/lib/tc.so"]) == {"PATH": "/bin", "LD_PRELOAD": "/lib/tc.so"}
    assert with_preload({"PATH": "/bin"}, []) == {"PATH": "/bin"}


def test_a_cpu_engine_gets_tcmalloc_where_the_machine_has_it() -> None:
    assert engine_preload("cpu", True, lambda: "/usr/lib/tc.so") == ("/usr/lib/tc.so",)
    assert engine_preload("cpu", False, lambda: "/usr/lib/tc.so") == ()  # the shape turned it off
    assert engine_preload("h100-80gb", True, lambda: "/usr/lib/tc.so") == ()  # vLLM asks for it on CPU only
    assert engine_preload("cpu", True, lambda: None) == ()


def test_the_set_up_installs_tcmalloc() -> None:
    # scripts/bootstrap.sh installs libtcmalloc-minimal4 with the other Debian packages.
    found = find_tcmalloc()
    assert found is not None, "tcmalloc is not installed: apt-get install libtcmalloc-minimal4"
    assert "tcmalloc" in Path(found).name
