"""``loadtests.environ.environment``: set inside the block, as it was after it."""

from __future__ import annotations

import os

import pytest

from loadtests.environ import environment


def test_variables_are_put_back_set_or_unset_even_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THAW_TEST_SET", "before")
    monkeypatch.delenv("THAW_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError), environment({"THAW_TEST_SET": "in", "THAW_TEST_UNSET": "in"}):
        assert os.environ["THAW_TEST_SET"] == os.environ["THAW_TEST_UNSET"] == "in"
        raise RuntimeError("a step that fails")
    assert os.environ["THAW_TEST_SET"] == "before" and "THAW_TEST_UNSET" not in os.environ
