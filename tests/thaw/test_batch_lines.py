"""A batch input file checked line by line (thaw.batch_lines): each bad line is its own
error with its number and reason, the others run; a file with no JSON line fails whole."""

from __future__ import annotations

import json

from thaw.batch_lines import check_lines

CHAT = "/v1/chat/completions"
MODELS = {"thaw-demo": "demo"}


def line(custom_id: object = "a", **over: object) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "thaw-demo", "messages": [{"role": "user", "content": "Hi"}]}}
    item.update(over)
    return json.dumps(item).encode() + b"\n"


def test_good_lines_run_and_each_bad_one_is_named() -> None:
    body = {"model": "thaw-demo", "messages": []}
    lines = [
        line("a"),                                                  # 1 ok
        b"{not json\n",                                             # 2
        b"\n",                                                      # 3 blank: not a request
        line("a"),                                                  # 4 duplicate of 1
        line(None),                                                 # 5
        line("m", method="GET"),                                    # 6
        line("u", url="/v1/completions"),                           # 7
        line("b", body="text"),                                     # 8
        line("n", body={"messages": []}),                           # 9
        line("s", body={**body, "stream": True}),                   # 10
        line("x", body={**body, "model": "secret"}),                # 11 not the tenant's
        b"[1, 2]\n",                                                # 12
        line("c"),                                                  # 13 ok
    ]
    checked = check_lines(lines, CHAT, MODELS.get)
    assert checked.not_jsonl is None
    assert [(r.line, r.custom_id, r.model) for r in checked.requests] == [(1, "a", "demo"), (13, "c", "demo")]
    assert [(e.line, e.code, e.param) for e in checked.errors] == [
        (2, "invalid_json_line", None), (4, "duplicate_custom_id", "custom_id"),
        (5, "missing_custom_id", "custom_id"), (6, "invalid_method", "method"), (7, "invalid_url", "url"),
        (8, "invalid_body", "body"), (9, "missing_model", "body.model"), (10, "invalid_request", "body.stream"),
        (11, "model_not_found", "body.model"), (12, "invalid_request", None)]
    assert checked.errors[1].custom_id == "a" and "earlier line" in checked.errors[1].message
    assert "'secret' does not exist" in checked.errors[8].message


def test_a_file_with_no_json_line_is_not_jsonl() -> None:
    checked = check_lines([b"hello\n", b"world\n"], CHAT, MODELS.get)
    assert checked.requests == [] and checked.not_jsonl is not None
    assert checked.not_jsonl.startswith("the file is not JSONL") and "line 1" in checked.not_jsonl
    assert check_lines([b"\n"], CHAT, MODELS.get).not_jsonl == "the file is not JSONL: no line is a JSON object (it has no lines)"
    # Not UTF-8 is not JSON either.
    assert check_lines([b"\xff\xfe\n"], CHAT, MODELS.get).not_jsonl is not None
    # One JSON line among others is JSONL with bad lines.
    mixed = check_lines([b"hello\n", line("a")], CHAT, MODELS.get)
    assert mixed.not_jsonl is None and len(mixed.requests) == 1 and mixed.errors[0].line == 1
