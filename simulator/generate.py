"""Synthetic traces of many low-traffic models, for scale-to-zero studies.

Each generator draws every model's arrivals at once with numpy, merges them by time
and returns a :class:`~simulator.traces.Trace` with models ``m000``, ``m001``, … (at
least three digits; a model that draws no request in ``duration_s`` is left out) and
one tenant, ``default``. Same arguments and seed, same trace.

Rates: ``rate_per_hour`` (or ``rate_on_per_s``) is every model's rate when ``sigma`` is
0; with ``sigma > 0`` each model's rate is that times a lognormal factor of log-sd
``sigma`` and mean 1 (``exp(sigma * Z - sigma**2 / 2)``), so the mean over models stays
the given rate while a few models get most of the traffic.

Tokens: each request's input and output counts are lognormal with the given means and
log-sd ``token_sigma`` (default 0.8: the median is about 0.73 of the mean and one
request in twenty is over 2.9 times it), rounded, at least 1.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.traces import DEFAULT_TENANT, Trace, from_columns

DAY_S = 86_400.0
TOKEN_SIGMA = 0.8


def poisson(
    n_models: int,
    duration_s: float,
    *,
    rate_per_hour: float = 6.0,
    sigma: float = 0.0,
    seed: int = 0,
    input_tokens: int = 1024,
    output_tokens: int = 256,
    token_sigma: float = TOKEN_SIGMA,
) -> Trace:
    """Each model a Poisson process at its own constant rate."""
    _check_common(n_models, duration_s, input_tokens, output_tokens, token_sigma)
    _check_rate("rate_per_hour", rate_per_hour, sigma)
    rng = np.random.default_rng(seed)
    rates_per_s = _spread(rng, rate_per_hour / 3600.0, sigma, n_models)
    counts = rng.poisson(rates_per_s * duration_s)
    model = np.repeat(np.arange(n_models), counts)
    t = rng.uniform(0.0, duration_s, len(model))
    return _finish(rng, t, model, n_models, input_tokens, output_tokens, token_sigma,
                   f"poisson(models={n_models}, duration_s={duration_s:g}, rate_per_hour={rate_per_hour:g}, "
                   f"sigma={sigma:g}, seed={seed})")


def bursty(
    n_models: int,
    duration_s: float,
    *,
    on_s: float = 600.0,
    off_s: float = 3600.0,
    rate_on_per_s: float = 0.05,
    sigma: float = 0.0,
    seed: int = 0,
    input_tokens: int = 1024,
    output_tokens: int = 256,
    token_sigma: float = TOKEN_SIGMA,
) -> Trace:
    """Each model on/off: exponential on and off periods (means ``on_s``, ``off_s``),
    Poisson at ``rate_on_per_s`` while on, nothing while off.

    A model starts on with probability ``on_s / (on_s + off_s)`` (the stationary share),
    so its mean rate over a long trace is ``rate_on_per_s * on_s / (on_s + off_s)``.
    """
    _check_common(n_models, duration_s, input_tokens, output_tokens, token_sigma)
    _check_rate("rate_on_per_s", rate_on_per_s, sigma)
    for name, v in (("on_s", on_s), ("off_s", off_s)):
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a positive number, not {v}")
    rng = np.random.default_rng(seed)
    rates = _spread(rng, rate_on_per_s, sigma, n_models)
    # Periods per model, interleaved off, on, off, on, …; the first off is 0 for a model
    # that starts on. Draw enough cycles for nearly every model, then top up the rest.
    cycle_s = on_s + off_s
    k = int(duration_s / cycle_s + 4 * math.sqrt(duration_s / cycle_s) + 4)
    starts_on = rng.random(n_models) < on_s / cycle_s
    periods = np.empty((n_models, 2 * k))
    periods[:, 0::2] = rng.exponential(off_s, (n_models, k))
    periods[:, 1::2] = rng.exponential(on_s, (n_models, k))
    periods[starts_on, 0] = 0.0
    ends = np.cumsum(periods, axis=1)
    while (short := ends[:, -1] < duration_s).any():
        more = np.empty((n_models, 2 * k))
        more[:, 0::2] = rng.exponential(off_s, (n_models, k))
        more[:, 1::2] = rng.exponential(on_s, (n_models, k))
        more[~short] = 0.0
        ends = np.concatenate([ends, ends[:, -1:] + np.cumsum(more, axis=1)], axis=1)
    on_start = ends[:, 0::2]
    on_end = np.minimum(ends[:, 1::2], duration_s)
    live = on_start < duration_s
    model_of = np.broadcast_to(np.arange(n_models)[:, None], on_start.shape)[live]
    start = on_start[live]
    length = np.maximum(on_end[live] - start, 0.0)
    counts = rng.poisson(rates[model_of] * length)
    t = np.repeat(start, counts) + rng.random(int(counts.sum())) * np.repeat(length, counts)
    model = np.repeat(model_of, counts)
    return _finish(rng, t, model, n_models, input_tokens, output_tokens, token_sigma,
                   f"bursty(models={n_models}, duration_s={duration_s:g}, on_s={on_s:g}, off_s={off_s:g}, "
                   f"rate_on_per_s={rate_on_per_s:g}, sigma={sigma:g}, seed={seed})")


def diurnal(
    n_models: int,
    duration_s: float,
    *,
    rate_per_hour: float = 6.0,
    peak_to_trough: float = 4.0,
    peak_hour: float = 14.0,
    phase_spread_h: float = 6.0,
    sigma: float = 0.0,
    seed: int = 0,
    input_tokens: int = 1024,
    output_tokens: int = 256,
    token_sigma: float = TOKEN_SIGMA,
) -> Trace:
    """Each model a Poisson process whose rate follows a 24 h sinusoid.

    ``rate(t) = r * (1 + a * cos(2π (t/3600 - peak_h) / 24))`` with ``t = 0`` at midnight,
    ``a = (peak_to_trough - 1) / (peak_to_trough + 1)`` and ``r`` the model's mean rate.
    Each model's ``peak_h`` is ``peak_hour`` plus a uniform offset in
    ``± phase_spread_h / 2`` (24 h: phases uniform around the clock). Drawn by thinning a
    Poisson process at the peak rate.
    """
    _check_common(n_models, duration_s, input_tokens, output_tokens, token_sigma)
    _check_rate("rate_per_hour", rate_per_hour, sigma)
    if not (peak_to_trough >= 1 and math.isfinite(peak_to_trough)):
        raise ValueError(f"peak_to_trough must be a number >= 1, not {peak_to_trough}")
    if not 0 <= phase_spread_h <= 24:
        raise ValueError(f"phase_spread_h must be between 0 and 24, not {phase_spread_h}")
    rng = np.random.default_rng(seed)
    rates_per_s = _spread(rng, rate_per_hour / 3600.0, sigma, n_models)
    peak_s = (peak_hour + rng.uniform(-0.5, 0.5, n_models) * phase_spread_h) * 3600.0
    a = (peak_to_trough - 1.0) / (peak_to_trough + 1.0)
    counts = rng.poisson(rates_per_s * (1.0 + a) * duration_s)
    model = np.repeat(np.arange(n_models), counts)
    t = rng.uniform(0.0, duration_s, len(model))
    accept = (1.0 + a * np.cos(2.0 * np.pi * (t - peak_s[model]) / DAY_S)) / (1.0 + a)
    keep = rng.random(len(t)) < accept
    return _finish(rng, t[keep], model[keep], n_models, input_tokens, output_tokens, token_sigma,
                   f"diurnal(models={n_models}, duration_s={duration_s:g}, rate_per_hour={rate_per_hour:g}, "
                   f"peak_to_trough={peak_to_trough:g}, peak_hour={peak_hour:g}, "
                   f"phase_spread_h={phase_spread_h:g}, sigma={sigma:g}, seed={seed})")


def model_names(n_models: int) -> list[str]:
    """``m000``, ``m001``, … (more digits past 1000 models)."""
    width = max(3, len(str(n_models - 1)))
    return [f"m{k:0{width}d}" for k in range(n_models)]


def _check_common(n_models: int, duration_s: float, input_tokens: int, output_tokens: int,
                  token_sigma: float) -> None:
    if n_models < 1:
        raise ValueError(f"n_models must be >= 1, not {n_models}")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"duration_s must be a positive number, not {duration_s}")
    for name, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, not {v}")
    if not (token_sigma >= 0 and math.isfinite(token_sigma)):
        raise ValueError(f"token_sigma must be a number >= 0, not {token_sigma}")


def _check_rate(name: str, rate: float, sigma: float) -> None:
    if not (rate >= 0 and math.isfinite(rate)):
        raise ValueError(f"{name} must be a number >= 0, not {rate}")
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a number >= 0, not {sigma}")


def _spread(rng: np.random.Generator, rate: float, sigma: float, n: int) -> np.ndarray:
    """Per-model rates: ``rate`` times a mean-1 lognormal factor of log-sd ``sigma``."""
    if sigma == 0:
        return np.full(n, rate)
    return rate * rng.lognormal(-sigma * sigma / 2.0, sigma, n)


def draw_tokens(rng: np.random.Generator, mean: int, sigma: float, n: int) -> np.ndarray:
    """``n`` token counts, lognormal of mean ``mean`` and log-sd ``sigma``, rounded, at least 1."""
    if sigma == 0:
        return np.full(n, mean, dtype=np.int64)
    draws = rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma, n)
    return np.maximum(np.rint(draws), 1).astype(np.int64)


def _finish(rng: np.random.Generator, t: np.ndarray, model: np.ndarray, n_models: int,
            input_tokens: int, output_tokens: int, token_sigma: float, source: str) -> Trace:
    n = len(t)
    return from_columns(t, model, np.zeros(n, dtype=np.int64),
                  draw_tokens(rng, input_tokens, token_sigma, n), draw_tokens(rng, output_tokens, token_sigma, n),
                  model_names(n_models), [DEFAULT_TENANT], source)
