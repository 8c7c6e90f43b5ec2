"""`thaw models deploy|update` settings from the command line."""

from __future__ import annotations

import argparse

import pytest

from thaw.cli.common import CliError
from thaw.cli.models import add_arguments, prewarm_windows, spec_of
from thaw.wire import ModelSpec


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments("update", p)
    return p.parse_args(["demo", *argv])


def test_prewarm_windows_become_the_schedule_and_none_clears_it() -> None:
    spec = spec_of(args("--prewarm", "55 8 * * 1-5;3600", "--prewarm", "0 20 * * *; 600 ;2"))
    assert spec == {"prewarm": [{"cron": "55 8 * * 1-5", "for_s": 3600.0},
                                {"cron": "0 20 * * *", "for_s": 600.0, "replicas": 2}]}
    assert ModelSpec.model_validate(spec).prewarm is not None
    assert spec_of(args("--prewarm", "none")) == {"prewarm": []}
    assert "prewarm" not in spec_of(args("--max-replicas", "2"))


@pytest.mark.parametrize("item", ["0 9 * * *", "0 9 * * *;x", "0 9 * * *;60;1.5", "a;b;c;d"])
def test_a_malformed_window_is_a_usage_error(item: str) -> None:
    with pytest.raises(CliError) as err:
        prewarm_windows([item])
    assert err.value.code == 2 and "--prewarm" in str(err.value)
