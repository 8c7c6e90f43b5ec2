"""simulator.generate and its CLI (simulator.gen_cli)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from simulator import gen_cli
from simulator.generate import bursty, diurnal, poisson
from simulator.traces import read_trace, write_generic

DAY_S = 86_400.0


def counts_per_model(tr: object) -> np.ndarray:
    return np.bincount(tr.model, minlength=len(tr.models))  # type: ignore[attr-defined]


def test_poisson_mean_rate_and_names() -> None:
    tr = poisson(50, 10 * DAY_S, rate_per_hour=6.0, seed=1)
    # 50 models x 240 h x 6/h = 72,000; Poisson sd 268; allow 5 sd
    assert abs(len(tr) - 72_000) < 1_340
    assert tr.models == [f"m{k:03d}" for k in range(50)] and tr.tenants == ["default"]
    assert tr.t == sorted(tr.t) and 0 <= tr.t[0] and tr.t[-1] < 10 * DAY_S


def test_sigma_spreads_rates_keeping_the_mean() -> None:
    flat = counts_per_model(poisson(200, 10 * DAY_S, rate_per_hour=6.0, seed=2))
    spread = counts_per_model(poisson(200, 10 * DAY_S, rate_per_hour=6.0, sigma=1.0, seed=2))
    # Each model expects 1440. Flat: sd ~ sqrt(1440) = 38. Spread: sd ~ 1440 x sqrt(e - 1) = 1890.
    assert flat.std() < 60 and spread.std() > 900
    # The mean over 200 models of a mean-1 lognormal with sigma 1: sd 1.31 / sqrt(200) = 0.09.
    assert abs(spread.mean() / 1440 - 1) < 0.3


def test_bursty_mean_rate_and_idle_gaps() -> None:
    tr = bursty(200, 2 * DAY_S, on_s=600, off_s=3000, rate_on_per_s=0.05, seed=3)
    # 0.05/s x 600/3600 on = 1/120 per s; x 172,800 s x 200 models = 288,000
    assert abs(len(tr) / 288_000 - 1) < 0.05
    t0 = np.asarray(tr.t)[np.asarray(tr.model) == 0]
    gaps = np.diff(t0)
    # While on: gaps of 20 s on average; off periods of 3000 s on average make the CV large.
    assert gaps.std() / gaps.mean() > 2


def test_diurnal_peak_to_trough() -> None:
    tr = diurnal(100, 10 * DAY_S, rate_per_hour=10.0, peak_to_trough=4.0, peak_hour=14.0,
                 phase_spread_h=0.0, seed=4)
    # 100 x 240 h x 10/h = 240,000 (sd 490)
    assert abs(len(tr) - 240_000) < 2_500
    hour = (np.asarray(tr.t) % DAY_S) // 3600
    peak, trough = np.sum(hour == 14), np.sum(hour == 2)
    # 14:00-15:00 vs 02:00-03:00: 1 + a cos(π/12·0.5) vs 1 - a cos(..); a = 3/5 → ratio ≈ 3.9
    assert 3.3 < peak / trough < 4.6


def test_tokens_lognormal_around_the_means() -> None:
    tr = poisson(20, DAY_S, rate_per_hour=100, input_tokens=2000, output_tokens=3, seed=5)
    assert abs(np.mean(tr.input_tokens) / 2000 - 1) < 0.03
    assert min(tr.output_tokens) >= 1
    assert len(set(tr.input_tokens)) > 100
    flat = poisson(2, 3600, rate_per_hour=50, token_sigma=0.0, seed=5)
    assert set(flat.input_tokens) == {1024} and set(flat.output_tokens) == {256}


@pytest.mark.parametrize("gen", [poisson, bursty, diurnal])
def test_same_seed_same_trace(gen) -> None:  # type: ignore[no-untyped-def]
    a = gen(10, DAY_S, seed=7, sigma=0.5)
    assert a == gen(10, DAY_S, seed=7, sigma=0.5)
    assert a.t != gen(10, DAY_S, seed=8, sigma=0.5).t


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_models": 0}, "n_models"),
    ({"duration_s": 0}, "duration_s"),
    ({"rate_per_hour": -1}, "rate_per_hour"),
    ({"sigma": -1}, "sigma"),
    ({"input_tokens": 0}, "input_tokens"),
])
def test_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    args = {"n_models": 2, "duration_s": 60.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        poisson(args.pop("n_models"), args.pop("duration_s"), **args)  # type: ignore[arg-type]


# -- CLI --------------------------------------------------------------------------------------


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="thaw simulate")
    gen_cli.add_arguments(parser)
    return gen_cli.run(parser.parse_args(argv))


@pytest.mark.parametrize(("text", "seconds"), [
    ("3600", 3600.0), ("90s", 90.0), ("15m", 900.0), ("15min", 900.0), ("6h", 21_600.0),
    ("1.5h", 5_400.0), ("21d", 1_814_400.0), ("2w", 1_209_600.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert gen_cli.parse_duration_s(text) == seconds


def test_cli_gen_writes_what_the_generator_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.csv"
    assert cli(["gen", "poisson", "--models", "5", "--duration", "6h", "--rate-per-hour", "20",
                "--sigma", "0.5", "--seed", "3", "--out", str(out)]) == 0
    expected = poisson(5, 21_600.0, rate_per_hour=20, sigma=0.5, seed=3)
    assert read_trace(out) == expected
    assert capsys.readouterr().out == f"wrote {out}: {len(expected):,} requests, 5 models, 1 tenant, " \
                                      f"over {expected.duration_s / 3600:.1f} h\n"
    for kind, extra in (("bursty", ["--on-s", "60", "--off-s", "120", "--rate-on-per-s", "0.5"]),
                        ("diurnal", ["--peak-to-trough", "3"])):
        assert cli(["gen", kind, "--models", "3", "--duration", "1d", *extra, "--out", str(out)]) == 0
        assert len(read_trace(out)) > 0


def test_cli_convert_reshapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "azure.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   + "".join(f"2023-11-16 18:{m:02d}:00.0000000,100,10\n" for m in range(20)))
    out = tmp_path / "c.csv"
    assert cli(["convert", "--trace", str(src), "--spread-models", "3", "--speedup", "60",
                "--start", "2", "--duration", "10", "--out", str(out)]) == 0
    tr = read_trace(out)
    # A request a minute; x60 → one a second; [2 s, 12 s) → 10 requests, shifted to 0..9 s.
    assert tr.t == [float(s) for s in range(10)]
    assert all(m.startswith("azure-") for m in tr.models)
    assert "10 requests" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["gen", "poisson", "--models", "0", "--duration", "1h", "--out", "{out}"], 2, "n_models must be >= 1"),
    (["gen", "poisson", "--models", "2", "--duration", "soon", "--out", "{out}"], 2, "duration 'soon'"),
    (["convert", "--trace", "{src}", "--thin", "2", "--out", "{out}"], 2, "--thin must be in (0, 1]"),
    (["convert", "--trace", "{missing}", "--out", "{out}"], 1, "no such file"),
    (["convert", "--trace", "{bad}", "--out", "{out}"], 1, "bad.csv:3: input_tokens '-1' is negative"),
])
def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
                    message: str) -> None:
    src = tmp_path / "g.csv"
    bad = tmp_path / "bad.csv"
    header = "timestamp,model,tenant,input_tokens,output_tokens\n"
    src.write_text(header + "0,a,x,1,1\n")
    bad.write_text(header + "0,a,x,1,1\n1,a,x,-1,1\n")
    paths = {"out": str(tmp_path / "o.csv"), "src": str(src), "bad": str(bad), "missing": str(tmp_path / "no.csv")}
    assert cli([a.format(**paths) for a in argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("thaw: error: ") and message in err
    assert not (tmp_path / "o.csv").exists()


def test_generated_trace_round_trips(tmp_path: Path) -> None:
    tr = diurnal(7, DAY_S, sigma=1.0, seed=9)
    write_generic(tr, tmp_path / "d.csv")
    assert read_trace(tmp_path / "d.csv") == tr
