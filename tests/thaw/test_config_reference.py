"""docs/reference/config.md is generated from thaw/config.py and kept in step with it."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from thaw import config_reference
from thaw.config import Autoscaling, Pricing, ThawConfig


def test_the_reference_is_up_to_date() -> None:
    page = config_reference.REFERENCE
    assert page.exists() and page.read_text() == config_reference.render(), (
        f"{page.relative_to(config_reference.ROOT)} is out of date: run `{config_reference.COMMAND}`")


def test_every_section_and_field_is_in_it() -> None:
    page = config_reference.render()
    for section in config_reference.sections():
        assert f'<a id="{section.model.__name__.lower()}"></a>' in page
        for name in section.model.model_fields:
            assert f"| `{name}` |" in page


def test_every_field_says_what_it_does() -> None:
    # A field without a comment above it (nor a group's) would be a blank row.
    blank = [f"{s.path or '(top)'}.{name}" for s in config_reference.sections()
             for name, text in config_reference.field_comments(s.model).items()
             if not (text or s.model.model_fields[name].description
                     or config_reference._section_summary(s.model.model_fields[name].annotation))]
    assert blank == [], "write a comment above these fields in thaw/config.py"


def test_a_comment_above_a_group_is_shared_by_the_group() -> None:
    comments = config_reference.field_comments(Pricing)
    # prompt_, cached_ and completion_usd_per_mtok sit under one comment.
    assert comments["prompt_usd_per_mtok"] == comments["cached_usd_per_mtok"] == comments["completion_usd_per_mtok"]
    assert comments["usd_per_gpu_second"] != comments["completion_usd_per_mtok"]


@pytest.mark.parametrize(("model", "field", "expected"), [
    (Autoscaling, "panic_threshold", "number >= 1"),
    (Autoscaling, "keep_alive", '"fixed" | "histogram"'),
    (Autoscaling, "ttft_slo_s", "number > 0 | null"),
    (ThawConfig, "shapes", "list of [InstanceShape](#instanceshape) (at least 1 items)"),
])
def test_types_read_as_the_code_checks_them(model: type[BaseModel], field: str, expected: str) -> None:
    info = model.model_fields[field]
    assert config_reference.type_text(info.annotation, info.metadata) == expected


def test_sections_name_their_yaml_path() -> None:
    paths = {s.path for s in config_reference.sections()}
    assert {"", "models[].autoscaling.keep_alive_histogram", "pools[].ec2", "tenants[].limits"} <= paths
    assert typing.get_origin(ThawConfig.model_fields["models"].annotation) is list


def test_check_fails_with_the_command_when_stale(tmp_path, monkeypatch, capsys) -> None:
    stale = tmp_path / "config.md"
    stale.write_text("old\n")
    monkeypatch.setattr(config_reference, "REFERENCE", stale)
    monkeypatch.setattr(config_reference, "ROOT", tmp_path)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.COMMAND in capsys.readouterr().err
    assert config_reference.main(["--write"]) == 0
    assert config_reference.main(["--check"]) == 0
