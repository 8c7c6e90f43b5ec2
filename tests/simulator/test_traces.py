"""simulator.traces: the readers on small files in each real format, errors, transforms."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simulator import traces
from simulator.traces import (
    FORMATS,
    Trace,
    TraceError,
    from_columns,
    head,
    merge,
    read_trace,
    speedup,
    spread_models,
    thin,
    window,
    write_generic,
)

# First rows of AzurePublicDataset data/AzureLLMInferenceTrace_code.csv (7 fractional digits).
AZURE = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:04.0781490,110,27
2023-11-16 18:17:04.1206440,7433,14
2023-11-16 18:17:33.4590290,1555,19
"""

# Mooncake conversation_trace.jsonl style: ms timestamps in ~3 s steps, 512-token block hashes.
MOONCAKE = """\
{"timestamp": 0, "input_length": 2000, "output_length": 500, "hash_ids": [0, 1, 2, 3]}
{"timestamp": 0, "input_length": 1900, "output_length": 490, "hash_ids": [0, 4, 5, 6]}
{"timestamp": 5999, "input_length": 400, "output_length": 3, "hash_ids": [8]}
{"timestamp": 3000, "input_length": 2290, "output_length": 316, "hash_ids": [0, 1, 2, 3, 7]}
"""

SERVEGEN_HEADER = "category,model,client_id,timestamp,rate,cv,pat_name,pat_arg1,pat_arg2\n"
# Rows as in the joined ServeGen file: idle windows kept (rate 0, empty pat_name).
SERVEGEN = SERVEGEN_HEADER + """\
language,m-small,0,0,0,0,,0,0
language,m-small,0,600,0.07666666666666666,1.1562268743398203,Gamma,0.74802116038809,0.04435406418012669
language,m-small,0,1200,0.16833333333333333,7.395771068414994,Weibull,0.4251687774268656,0.009046081681765827
language,m-small,5,1200,0.05,1.0,Gamma,1.0,20.0
reason,deepseek-r1,7,600,0.02,0.7497713230907656,Gamma,1.7788625222548247,0.0013287359280492685
reason,deepseek-r1,7,1200,0,0,,0,0
"""

GENERIC = """\
timestamp,model,tenant,input_tokens,output_tokens
2.5,llama,acme,100,10
0.5,qwen,beta,200,20
2.5,qwen,acme,300,30
1.0,llama,acme,400,40
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def servegen_rows(n_windows: int, rate: float, dist: str, shape: float, client: int = 0,
                  model: str = "m-small") -> str:
    # The scale is deliberately off (x3 the mean gap): draws are rescaled to the rate.
    scale = 3.0 / rate / shape if dist == "Gamma" else 3.0 / rate / math.gamma(1 + 1 / shape)
    return "".join(f"language,{model},{client},{600 * w},{rate},1.0,{dist},{shape},{scale}\n"
                   for w in range(n_windows))


# -- readers ----------------------------------------------------------------------------------


def test_azure_times_from_the_first_request_one_service(tmp_path: Path) -> None:
    tr = read_trace(write(tmp_path, "code.csv", AZURE))
    # 18:17:04.0319600 - 18:17:03.9799600 = 0.052; ... 18:17:33.4590290 - 03.9799600 = 29.479069
    assert tr.t == [0.0, 0.052, 0.098189, 0.140684, 29.479069]
    assert tr.input_tokens == [4808, 3180, 110, 7433, 1555]
    assert tr.output_tokens == [10, 8, 27, 14, 19]
    assert (tr.models, tr.tenants) == (["code"], ["default"])
    assert set(tr.model) == set(tr.tenant) == {0}
    assert tr.prefix_hit is None
    assert (len(tr), tr.duration_s) == (5, 29.479069)
    assert read_trace(tmp_path / "code.csv", "azure", model="starcoder").models == ["starcoder"]


def test_azure_accepts_zones_and_t_separator(tmp_path: Path) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10T00:00:01.5+00:00,1,2\n2024-05-10 01:00:00+01:00,3,4\n"
    # 01:00+01:00 is 00:00 UTC: it comes first, 1.5 s before the other.
    assert read_trace(write(tmp_path, "a.csv", text)).t == [0.0, 1.5]


def test_mooncake_ms_to_s_sorted_with_prefix_hits(tmp_path: Path) -> None:
    tr = read_trace(write(tmp_path, "conv.jsonl", MOONCAKE))
    assert tr.t == [0.0, 0.0, 3.0, 5.999]
    assert tr.input_tokens == [2000, 1900, 2290, 400]
    # [0,1,2,3]: nothing seen → 0; [0,4,5,6]: block 0 seen → 1/4;
    # [0,1,2,3,7] (at 3 s, before the 5.999 s line): 4 of 5 seen → 0.8; [8] → 0.
    assert tr.prefix_hit == [0.0, 0.25, 0.8, 0.0]
    assert tr.models == ["conv"]


@pytest.mark.parametrize(("name", "text", "fmt"), [
    ("a.csv", AZURE, "azure"),
    ("m.jsonl", MOONCAKE, "mooncake"),
    ("s.csv", SERVEGEN, "servegen"),
    ("g.csv", GENERIC, "generic"),
])
def test_format_told_from_the_first_line(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    path = write(tmp_path, name, text)
    assert traces._sniff(path) == fmt
    assert read_trace(path) == read_trace(path, fmt)


def test_generic_rows_sorted_stably(tmp_path: Path) -> None:
    tr = read_trace(write(tmp_path, "g.csv", GENERIC))
    assert tr.t == [0.5, 1.0, 2.5, 2.5]
    # The two rows at 2.5 keep their file order: llama/100 before qwen/300.
    assert tr.input_tokens == [200, 400, 100, 300]
    assert [tr.models[m] for m in tr.model] == ["qwen", "llama", "llama", "qwen"]
    assert tr.models == ["llama", "qwen"] and tr.tenants == ["acme", "beta"]
    only = read_trace(tmp_path / "g.csv", model="qwen")
    assert (only.models, only.input_tokens) == (["qwen"], [200, 300])


def test_generic_chunks_blank_lines_and_crlf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traces, "_CHUNK_ROWS", 2)
    text = ("timestamp,model,tenant,input_tokens,output_tokens\r\n"
            "0,a,x,1,1\r\n\r\n1,b,x,2,2\r\n2,\"c,d\",x,3,3\r\n3,a,y,4,4\r\n")
    tr = read_trace(write(tmp_path, "g.csv", text))
    assert tr.input_tokens == [1, 2, 3, 4]
    assert tr.models == ["a", "b", "c,d"]
    bad = text + "4,a,x,-1,1\r\n"
    with pytest.raises(TraceError) as err:
        read_trace(write(tmp_path, "bad.csv", bad))
    assert err.value.line == 7  # header, 4 rows, a blank line, then the bad row


def test_round_trip_through_generic(tmp_path: Path) -> None:
    for name, text in (("a.csv", AZURE), ("m.jsonl", MOONCAKE), ("s.csv", SERVEGEN), ("g.csv", GENERIC)):
        tr = read_trace(write(tmp_path, name, text))
        write_generic(tr, tmp_path / "out.csv")
        back = read_trace(tmp_path / "out.csv")
        assert back == tr, name
        assert back.prefix_hit == tr.prefix_hit


def test_round_trip_rounds_to_microseconds_and_quotes_names(tmp_path: Path) -> None:
    tr = from_columns([0.1234567, 1 / 3], [0, 1], [0, 0], [1, 2], [3, 4], ["a,b", 'say "hi"'], ["t"], "test")
    assert tr.t == [0.123457, 0.333333]
    write_generic(tr, tmp_path / "q.csv")
    assert read_trace(tmp_path / "q.csv") == tr


# -- ServeGen ---------------------------------------------------------------------------------


def test_servegen_windows_models_and_tenants(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", SERVEGEN)
    tr = read_trace(path, seed=1, input_tokens=500, output_tokens=50)
    assert tr.models == ["deepseek-r1", "m-small"]
    assert tr.tenants == ["c0", "c5", "c7"]
    assert set(tr.input_tokens) == {500} and set(tr.output_tokens) == {50}
    by_window: dict[tuple[str, int], int] = {}
    for t, m, te in zip(tr.t, tr.model, tr.tenant, strict=True):
        key = (f"{tr.models[m]}/{tr.tenants[te]}", int(t // 600) * 600)
        by_window[key] = by_window.get(key, 0) + 1
    # rate x 600: 0.0766.. → 46, 0.1683.. → 101, 0.05 → 30, 0.02 → 12; idle windows give none.
    assert by_window == {("m-small/c0", 600): 46, ("m-small/c0", 1200): 101,
                         ("m-small/c5", 1200): 30, ("deepseek-r1/c7", 600): 12}
    per_tenant = read_trace(path, seed=1, servegen_model_per="tenant")
    assert per_tenant.models == ["deepseek-r1-c7", "m-small-c0", "m-small-c5"]
    assert per_tenant.t == tr.t
    only = read_trace(path, seed=1, model="deepseek-r1")
    assert (only.models, len(only)) == (["deepseek-r1"], 12)


@pytest.mark.parametrize(("dist", "shape"), [("Gamma", 1.0), ("Gamma", 0.3), ("Weibull", 0.5), ("Weibull", 2.0)])
def test_servegen_count_matches_rate_in_each_window(tmp_path: Path, dist: str, shape: float) -> None:
    # 0.0125 req/s x 600 s = 7.5: each window gets 7 or 8 at random, mean 7.5.
    # 200 windows: 1500 expected, sd sqrt(200 x 0.25) = 7.1; allow 5 sd.
    path = write(tmp_path, "s.csv", SERVEGEN_HEADER + servegen_rows(200, 0.0125, dist, shape))
    tr = read_trace(path, seed=3)
    assert abs(len(tr) - 1500) < 36
    counts = np.bincount((np.asarray(tr.t) // 600).astype(int), minlength=200)
    assert set(counts.tolist()) <= {7, 8}
    assert all(0 <= t < 200 * 600 for t in tr.t)


def test_servegen_shape_sets_burstiness(tmp_path: Path) -> None:
    # 60 requests per window; gaps' CV: Gamma shape 1 (exponential) about 1,
    # Weibull shape 0.3 about 5 in theory (sqrt(Γ(1+2/k)/Γ(1+1/k)² - 1)).
    def gap_cv(dist: str, shape: float) -> float:
        path = write(tmp_path, f"{dist}.csv", SERVEGEN_HEADER + servegen_rows(100, 0.1, dist, shape))
        t = np.asarray(read_trace(path, seed=5).t)
        gaps = np.diff(t)[np.diff(t // 600) == 0]  # within a window
        return float(gaps.std() / gaps.mean())

    assert 0.8 < gap_cv("Gamma", 1.0) < 1.2
    assert gap_cv("Weibull", 0.3) > 2.0


def test_servegen_same_seed_same_trace(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", SERVEGEN_HEADER + servegen_rows(20, 0.05, "Gamma", 0.5)
                 + servegen_rows(20, 0.05, "Weibull", 0.5, client=1))
    assert read_trace(path, seed=1) == read_trace(path, seed=1)
    assert read_trace(path, seed=1).t != read_trace(path, seed=2).t


def test_servegen_rate_scale_and_request_cap(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", SERVEGEN_HEADER + servegen_rows(10, 1.0, "Gamma", 1.0))
    # 10 windows x 600 req = 6000; x 0.1 = 600
    assert len(read_trace(path, servegen_rate_scale=0.1)) == 600
    with pytest.raises(TraceError, match=r"about 6e\+03 requests \(m-small 6e\+03\).*model="):
        read_trace(path, servegen_max_requests=5000)


# -- errors -----------------------------------------------------------------------------------

G_HEADER = "timestamp,model,tenant,input_tokens,output_tokens\n"


@pytest.mark.parametrize(("name", "text", "line", "message"), [
    ("generic_missing_column", "timestamp,model,input_tokens,output_tokens\n0,a,1,1\n", 1, "missing column tenant"),
    ("generic_negative_tokens", G_HEADER + "0,a,x,1,1\n1,a,x,-5,1\n", 3, "input_tokens '-5' is negative"),
    ("generic_fractional_tokens", G_HEADER + "0,a,x,1,1.5\n", 2, "output_tokens '1.5' is not an integer"),
    ("generic_bad_time", G_HEADER + "0,a,x,1,1\nsoon,a,x,1,1\n", 3, "timestamp 'soon' is not a number"),
    ("generic_negative_time", G_HEADER + "-1,a,x,1,1\n", 2, "timestamp '-1' must be a finite number >= 0"),
    ("generic_nan_time", G_HEADER + "nan,a,x,1,1\n", 2, "timestamp 'nan'"),
    ("generic_short_row", G_HEADER + "0,a,x,1,1\n1,a,x,1\n", 3, "expected 5 fields, got 4"),
    ("generic_empty_model", G_HEADER + "0,a,x,1,1\n1,,x,1,1\n", 3, "empty model name"),
    ("azure_bad_time", AZURE + "2023-11-16 25:00:00.0,1,1\n", 7, "TIMESTAMP '2023-11-16 25:00:00.0' is not a date"),
    ("azure_negative_tokens", AZURE + "2023-11-16 18:17:34.0,-1,1\n", 7, "ContextTokens -1 is negative"),
    ("azure_missing_column", "TIMESTAMP,ContextTokens\n", 1, "missing column GeneratedTokens"),
    ("mooncake_bad_json", MOONCAKE + '{"timestamp": 1,\n', 5, "not a JSON object"),
    ("mooncake_missing_key", '{"timestamp": 0, "input_length": 5}\n', 1, "missing key output_length"),
    ("mooncake_negative", '{"timestamp": 0, "input_length": 5, "output_length": -2}\n', 1, "output_length -2 is negative"),
    ("servegen_unknown_pattern", SERVEGEN + "language,m-small,0,1800,0.1,1,Pareto,1,1\n", 8,
     "pat_name 'Pareto' is not one of Gamma, Weibull or empty"),
    ("servegen_bad_rate", SERVEGEN + "language,m-small,0,1800,fast,1,Gamma,1,1\n", 8, "rate 'fast' is not a number"),
    ("servegen_zero_shape", SERVEGEN + "language,m-small,0,1800,0.1,1,Gamma,0,1\n", 8, "shape and scale must be > 0"),
])
def test_bad_input_names_file_line_and_problem(tmp_path: Path, name: str, text: str, line: int,
                                               message: str) -> None:
    fmt = name.split("_")[0]
    path = write(tmp_path, f"{name}.{'jsonl' if fmt == 'mooncake' else 'csv'}", text)
    with pytest.raises(TraceError) as err:
        read_trace(path, fmt)
    assert isinstance(err.value, ValueError)
    assert err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert message in str(err.value)


def test_unknown_format_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown format 'parquet'; valid formats: generic, azure, mooncake, servegen"):
        read_trace(write(tmp_path, "g.csv", GENERIC), "parquet")
    assert FORMATS == ("generic", "azure", "mooncake", "servegen")


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty file"),
    ("a,b,c\n1,2,3\n", "cannot tell the format from the header 'a,b,c'"),
])
def test_format_that_cannot_be_told(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, "x.csv", text))


def test_missing_file_and_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "nope.csv", "generic")
    with pytest.raises(TraceError, match="no windows for model 'gpt'; models: deepseek-r1, m-small"):
        read_trace(write(tmp_path, "s.csv", SERVEGEN), model="gpt")
    with pytest.raises(TraceError, match="no requests for model 'gpt'; models: llama, qwen"):
        read_trace(write(tmp_path, "g.csv", GENERIC), model="gpt")


# -- transforms -------------------------------------------------------------------------------


def uniform(n: int, duration_s: float = 1000.0, models: int = 1) -> Trace:
    t = np.linspace(0, duration_s, n, endpoint=False)
    return from_columns(t, np.arange(n) % models, np.zeros(n, int), np.full(n, 100), np.full(n, 10),
                        [f"s{k}" for k in range(models)], ["default"], "uniform")


def test_speedup_divides_times() -> None:
    tr = uniform(4)  # 0, 250, 500, 750
    assert speedup(tr, 2).t == [0.0, 125.0, 250.0, 375.0]
    assert speedup(tr, 2).input_tokens == tr.input_tokens
    with pytest.raises(ValueError):
        speedup(tr, 0)


def test_thin_keeps_a_share_deterministically() -> None:
    tr = uniform(10_000)
    kept = thin(tr, 0.3, seed=1)
    # binomial(10000, 0.3): mean 3000, sd 46; allow 5 sd
    assert abs(len(kept) - 3000) < 230
    assert kept == thin(tr, 0.3, seed=1) and kept != thin(tr, 0.3, seed=2)
    assert thin(tr, 1.0) == tr
    assert set(kept.t) <= set(tr.t)


def test_spread_models_zipf_shares() -> None:
    tr = uniform(20_000)
    spread = spread_models(tr, 4, seed=0)
    # weights 1, 1/2, 1/3, 1/4 → shares 12/25, 6/25, 4/25, 3/25 = 0.48, 0.24, 0.16, 0.12
    shares = np.bincount(spread.model) / len(spread)
    assert np.allclose(shares, [0.48, 0.24, 0.16, 0.12], atol=0.015)
    assert spread.models == ["s0-000", "s0-001", "s0-002", "s0-003"]
    assert spread.t == tr.t
    assert spread_models(tr, 2, prefix="m").models == ["m000", "m001"]
    flat = np.bincount(spread_models(tr, 4, zipf_s=0.0).model) / len(tr)
    assert np.allclose(flat, 0.25, atol=0.015)


def test_thin_after_spread_with_the_same_seed_keeps_every_model() -> None:
    # Both draw uniforms: on one shared stream thin would keep only the popular models.
    tr = thin(spread_models(uniform(20_000), 50, seed=0), 0.5, seed=0)
    assert len(tr.models) == 50


def test_window_is_half_open_and_shifted() -> None:
    tr = uniform(10)  # 0, 100, ..., 900
    w = window(tr, 200, 300)
    assert w.t == [0.0, 100.0, 200.0]  # 200, 300, 400 shifted by -200; 500 is out
    assert len(window(tr, 5000, 10)) == 0


def test_head_and_dropped_models_are_compacted() -> None:
    tr = uniform(10, models=3)  # models s0, s1, s2, s0, ...
    h = head(tr, 2)
    assert (h.models, h.model) == (["s0", "s1"], [0, 1])
    assert head(tr, 100) == tr


def test_merge_matches_names_and_orders_by_time(tmp_path: Path) -> None:
    a = from_columns([0.0, 2.0], [0, 0], [0, 0], [1, 1], [1, 1], ["b"], ["x"], "a")
    b = from_columns([1.0, 2.0], [0, 1], [0, 0], [2, 2], [2, 2], ["a", "b"], ["y"], "b")
    m = merge(a, b)
    assert m.t == [0.0, 1.0, 2.0, 2.0]
    assert [m.models[i] for i in m.model] == ["b", "a", "b", "b"]
    assert m.input_tokens == [1, 2, 1, 2]  # the tie at 2.0 in argument order
    assert (m.models, m.tenants) == (["a", "b"], ["x", "y"])
    moon = read_trace(write(tmp_path, "m.jsonl", MOONCAKE))
    assert merge(moon, moon).prefix_hit is not None
    assert merge(moon, a).prefix_hit is None


def test_trace_columns_must_match_in_length() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        Trace(t=[0.0], model=[], tenant=[0], input_tokens=[1], output_tokens=[1], models=["a"], tenants=["x"])
    assert len(uniform(0)) == 0 and uniform(0).duration_s == 0.0
