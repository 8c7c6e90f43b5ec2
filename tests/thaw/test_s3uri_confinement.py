"""Model URIs stay inside the store prefixes the config allows (thaw.s3uri, one check
for the config, the worker's assignments, `thaw push` and manifests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from thaw.config import ConfigError, parse_config
from thaw.s3uri import S3UriError, check_allowed, check_key_path, check_uri, split_uri

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"

ALLOWED = ["s3://thaw/models", "s3://thaw/team-a/"]


@pytest.mark.parametrize(
    ("uri", "admitted"),
    [
        ("s3://thaw/models", True),  # the prefix itself
        ("s3://thaw/models/", True),  # written as a folder
        ("s3://thaw/models/demo", True),
        ("s3://thaw/models/org/demo-7b/", True),
        ("s3://thaw/team-a/x", True),
        ("s3://thaw/models-evil/x", False),  # a longer name is not a sub-folder
        ("s3://thaw/modelsx", False),
        ("s3://thaw/team-ab/x", False),
        ("s3://thaw/", False),  # the bucket root is above both prefixes
        ("s3://thaw", False),
        ("s3://thaw/other/x", False),
        ("s3://other/models/x", False),  # another bucket, same path
        ("s3://thaw-evil/models/x", False),
    ],
)
def test_allowed_prefixes_compare_whole_segments(uri: str, admitted: bool) -> None:
    if admitted:
        assert check_allowed(uri, ALLOWED) == uri
    else:
        with pytest.raises(S3UriError, match="outside the allowed prefixes"):
            check_allowed(uri, ALLOWED)


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://thaw/models/../secrets/x", "'..' segment"),
        ("s3://thaw/models/..", "'..' segment"),
        ("s3://thaw/../models/x", "'..' segment"),
        ("s3://thaw/models/./x", "'.' segment"),
        ("s3://thaw/models//x", "empty segment"),
        ("s3://thaw//models/x", "empty segment"),
        ("s3://thaw/models/x//", "empty segment"),
        ("s3://thaw/models/%2e%2e/secrets", "'%'"),
        ("s3://thaw/models/%2E%2E%2Fsecrets", "'%'"),
        ("s3://thaw/models/%2fx", "'%'"),
        ("s3://thaw/models\\..\\secrets", "'\\\\\\\\'"),
        ("s3://thaw/models/a b", "' '"),
        ("s3://thaw/models/a\nb", "'\\\\n'"),
        ("s3://thaw/models/\x00", "'\\\\x00'"),
        ("file:///etc/passwd", "file:// is refused"),
        ("http://169.254.169.254/latest/meta-data", "http:// is refused"),
        ("https://thaw.s3.amazonaws.com/models/x", "https:// is refused"),
        ("gs://thaw/models/x", "gs:// is refused"),
        ("S3://thaw/models/x", "not an s3:// URI"),
        ("/models/x", "not an s3:// URI"),
        ("models/x", "not an s3:// URI"),
        ("s3://", "not a valid bucket"),
        ("s3:///models/x", "not a valid bucket"),
        ("s3://Thaw/models/x", "not a valid bucket"),
        ("s3://th..aw/models/x", "not a valid bucket"),
        ("s3://thaw@evil/models/x", "not a valid bucket"),
        ("s3://thaw:80/models/x", "not a valid bucket"),
    ],
)
def test_uris_that_could_escape_are_refused_whatever_the_prefixes(uri: str, why: str) -> None:
    with pytest.raises(S3UriError, match=why):
        check_uri(uri)
    with pytest.raises(S3UriError):
        check_allowed(uri, ["s3://thaw/"])  # even with the whole bucket allowed


def test_split_uri_gives_bucket_and_segments() -> None:
    assert split_uri("s3://thaw/models/demo/") == ("thaw", ("models", "demo"))
    assert split_uri("s3://thaw/") == ("thaw", ())
    assert split_uri("s3://thaw") == ("thaw", ())


@pytest.mark.parametrize(
    "path",
    ["../x.safetensors", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "a\\..\\b", "%2e%2e/x", "", "a/"],
)
def test_relative_object_paths_may_not_leave_their_prefix(path: str) -> None:
    with pytest.raises(S3UriError):
        check_key_path(path)


def test_plain_relative_paths_pass() -> None:
    assert check_key_path("model-00001-of-00002.safetensors") == ("model-00001-of-00002.safetensors",)
    assert check_key_path("tokenizer/vocab.json") == ("tokenizer", "vocab.json")
    assert check_key_path("a..b/.hidden") == ("a..b", ".hidden")  # dots inside a name are fine


# -- the config ------------------------------------------------------------------------


def _config(**object_store: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data["object_store"].update(object_store)
    return data


def _problems(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return "\n".join(exc.value.problems)


def test_allowed_prefixes_default_to_the_whole_bucket() -> None:
    assert parse_config(_config()).object_store.allowed_prefixes == ["s3://thaw/"]
    data = _config(bucket="models-bucket")
    data["models"][0]["uri"] = "s3://models-bucket/demo"
    assert parse_config(data).object_store.allowed_prefixes == ["s3://models-bucket/"]


def test_a_model_in_another_bucket_is_refused_at_load() -> None:
    data = _config()
    data["models"][0]["uri"] = "s3://other-bucket/models/demo"
    assert "outside the allowed prefixes ['s3://thaw/']" in _problems(data)


def test_a_model_outside_the_allowed_prefixes_is_refused_at_load() -> None:
    data = _config(allowed_prefixes=["s3://thaw/models"])
    assert parse_config(data).object_store.allowed_prefixes == ["s3://thaw/models"]  # s3://thaw/models/demo
    data["models"][0]["uri"] = "s3://thaw/models-evil/demo"
    assert "models[0] (demo): uri 's3://thaw/models-evil/demo' is outside the allowed prefixes" in _problems(data)


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://thaw/models/../../etc", "'..' segment"),
        ("s3://thaw/models/%2e%2e/x", "'%'"),
        ("file:///etc/passwd", "file:// is refused"),
        ("s3://thaw/models//demo", "empty segment"),
    ],
)
def test_a_model_uri_that_could_escape_is_refused_at_load(uri: str, why: str) -> None:
    data = _config()
    data["models"][0]["uri"] = uri
    problems = _problems(data)
    assert problems.startswith("models[0].uri: ") and why.strip("'") in problems


def test_allowed_prefixes_must_be_in_the_configured_bucket() -> None:
    assert "'s3://other/models' is not in the bucket 'thaw'" in _problems(
        _config(allowed_prefixes=["s3://other/models"]))
    assert "'..' segment" in _problems(_config(allowed_prefixes=["s3://thaw/models/.."]))
    assert "allowed_prefixes" in _problems(_config(allowed_prefixes=[]))


def test_a_manifest_naming_a_file_outside_its_prefix_is_refused() -> None:
    from pydantic import ValidationError

    from weight_streaming.manifest import FileEntry

    assert FileEntry(path="sub/model.safetensors", size=1, sha256="x", etag="e").path == "sub/model.safetensors"
    for path in ("../other-model/model.safetensors", "/etc/passwd", "a/%2e%2e/b", "a\\b"):
        with pytest.raises(ValidationError):
            FileEntry(path=path, size=1, sha256="x", etag="e")
