"""Header validation: every malformed file is refused with a message that says what is wrong."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weight_streaming.safetensors_header import (
    MAX_HEADER_BYTES,
    MalformedSafetensors,
    TensorInfo,
    header_length,
    parse_header,
    read_header_from_file,
)


def hdr(**tensors: object) -> bytes:
    return json.dumps(tensors).encode()


def t(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_real_file_parses_to_offsets_and_summary(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(
        {"a": torch.zeros(2, 3, dtype=torch.float32), "b": torch.zeros(5, dtype=torch.bfloat16)},
        str(path),
        metadata={"format": "pt"},
    )
    h = read_header_from_file(str(path))
    # save_file orders by alignment, then name: a (24 bytes f32) then b (10 bytes bf16).
    assert h.tensors["a"] == TensorInfo("a", "F32", (2, 3), 0, 24)
    assert h.tensors["b"] == TensorInfo("b", "BF16", (5,), 24, 34)
    assert h.metadata == {"format": "pt"}
    assert h.data_len == 34
    assert h.file_size == path.stat().st_size
    assert h.summary()["parameter_count"] == 6 + 5
    assert h.summary()["dtypes"] == {"BF16": 5, "F32": 6}


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"{not json", "header is not valid UTF-8 JSON"),
        (b"\xff\xfe{}", "header is not valid UTF-8 JSON"),
        (b"[1, 2]", "header must be a JSON object, got list"),
        (hdr(__metadata__={"k": 1}), "__metadata__ must map strings to strings"),
        (hdr(w=[1]), "tensor 'w': entry must be an object"),
        (hdr(w=t("F33", [1], 0, 4)), "tensor 'w': unknown dtype 'F33'"),
        (hdr(w=t("F32", [-1], 0, 4)), "shape must be a list of non-negative integers"),
        (hdr(w=t("F32", [True], 0, 4)), "shape must be a list of non-negative integers"),
        (
            hdr(w={"dtype": "F32", "shape": [1], "data_offsets": [0]}),
            "data_offsets must be two non-negative integers",
        ),
        (hdr(w=t("F32", [1], 8, 4)), "data_offsets end 4 is before begin 8"),
        # 3 x F32 = 12 bytes, but the offsets span 8.
        (hdr(w=t("F32", [3], 0, 8)), r"F32 \(3,\) needs 12 bytes but data_offsets span 8"),
        (hdr(w=t("BF16", [2, 2], 0, 16)), r"BF16 \(2, 2\) needs 8 bytes but data_offsets span 16"),
        (
            hdr(a=t("F32", [2], 0, 8), b=t("F32", [2], 4, 12)),
            "tensor 'b' at byte 4 overlaps the previous tensor",
        ),
        (
            hdr(a=t("F32", [2], 0, 8), b=t("F32", [2], 12, 20)),
            "tensor 'b' at byte 12 leaves a gap at byte 8",
        ),
        (hdr(a=t("F32", [2], 4, 12)), "tensor 'a' at byte 4 leaves a gap at byte 0"),
    ],
)
def test_malformed_headers_are_refused(header: bytes, message: str) -> None:
    with pytest.raises(MalformedSafetensors, match=message):
        parse_header(header, source="x.safetensors")


def test_messages_name_the_source() -> None:
    with pytest.raises(MalformedSafetensors, match=r"^shard-3\.safetensors: "):
        parse_header(b"{", source="shard-3.safetensors")


def test_file_size_must_match_exactly() -> None:
    header = hdr(w=t("F32", [2], 0, 8))
    # 8-byte prefix + header + 8 data bytes.
    exact = 8 + len(header) + 8
    assert parse_header(header, file_size=exact).data_len == 8
    with pytest.raises(
        MalformedSafetensors,
        match=rf"file is {exact + 3} bytes but its header describes only {exact}$",
    ):
        parse_header(header, file_size=exact + 3)  # trailing garbage
    with pytest.raises(
        MalformedSafetensors,
        match=rf"file is {exact - 1} bytes but its header describes {exact} \(truncated file\?\)",
    ):
        parse_header(header, file_size=exact - 1)


def test_zero_size_and_scalar_tensors_are_valid() -> None:
    h = parse_header(hdr(s=t("F64", [], 0, 8), e=t("I32", [0, 4], 8, 8), b=t("BOOL", [3], 8, 11)))
    assert h.tensors["s"].numel == 1
    assert h.tensors["e"].nbytes == 0
    assert h.data_len == 11


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (b"\x01\x02", "file is 2 bytes, shorter than the 8-byte header length"),
        (struct.pack("<Q", 0), "header length is 0"),
        (
            struct.pack("<Q", MAX_HEADER_BYTES + 1),
            f"exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes",
        ),
    ],
)
def test_bad_length_prefix(prefix: bytes, message: str) -> None:
    with pytest.raises(MalformedSafetensors, match=message):
        header_length(prefix)


def test_header_length_past_end_of_file(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 50) + b"{}")
    with pytest.raises(
        MalformedSafetensors, match="header length 50 runs past the end of the 10-byte file"
    ):
        read_header_from_file(str(path))


def test_falsy_non_object_metadata_is_refused() -> None:
    from weight_streaming.safetensors_header import parse_header

    for bad in ("[]", '""', "0", "null"):
        with pytest.raises(MalformedSafetensors, match="__metadata__ must map strings to strings"):
            parse_header(('{"__metadata__": ' + bad + "}").encode())
