"""Modeled BurstGPT: a generator built from what the BurstGPT authors published, not the trace.

The real BurstGPT CSVs (github.com/HPMLL/BurstGPT release assets; Wang et al., "BurstGPT: A
Real-World Workload Dataset to Optimize LLM Serving Systems", KDD 2025, arXiv 2401.17644)
are Git LFS / release assets no machine of this project can reach. When ``BurstGPT_1.csv``
is absent, the corpus uses this generator instead and labels it ``burstgpt-modeled``
everywhere: it is **modeled BurstGPT (parameters partly guessed)**, never the real trace.

Every number below comes from ``burstgpt-published-model.md`` / ``.json`` (the compiled
characterization beside the data mirror) and carries its tier there: A = author artifact
(README, generator code, figures read by eye), B = paper sentence quoted by a third party,
C = third-party measurement, D = arithmetic on tier-A numbers, G = our guess (nothing
published). What the model is:

- Four streams, one per ``Model`` x ``Log Type`` of the released schema (A), with client
  ids as the real adapter writes them (``ChatGPT/Conversation log``, ``GPT-4/API log``, ...).
- Arrivals: Gamma inter-arrival times, re-parameterised every 20 minutes, as the authors'
  "Modeled Scaling" generator does (A: Gamma family; B: 20-min windows). The per-window
  alpha/beta tables were never published (A: issue #5), so each 20-min segment's rate is
  base(hour, weekday) x a day level x a segment burst factor (both mean-one lognormal, G),
  and its Gamma shape is fixed per stream: API 0.5 (CV 1.41, the authors' generator
  default, A; third-party API CV ~1.5, C), Conversation 1.0 (G; third-party 0.92, C).
  Each segment is a stationary renewal process (the first arrival from the equilibrium
  forward-recurrence distribution), so a segment boundary adds no artificial arrival.
- Conversation base rates: the eyeballed hourly medians of the authors' daily-periodicity
  figure (A, +-10-20 %) on weekdays, x 0.5 on weekends (A, weekly heatmap: weekdays
  ~1,700-2,800/day vs weekends ~700-1,500 for ChatGPT-Conv). API: aperiodic (A/B); daily
  totals from the README line count (1,429.7k rows over 61 days = 23.4k/day, D) minus
  conversation (~2.5k/day, D), split ChatGPT-API 17.9k / GPT-4-API 3.0k per day (G, from
  the heatmap's ranges); GPT-4-API elevated 00-04 h and sparse 05-09 h (A, eyeballed).
  API day levels vary widely (lognormal sigma 0.8: the heatmap swings from <1k to >=28k
  requests/day, A; sigma is G); within-day bursts sigma 0.6 (G). Day 0 is a Monday (G).
- Request tokens: Zipf family (B; the authors' generator samples Zipf, A). Its theta = 1.1
  truncated to 1..1023 gives mean ~102, far below the real prompts, so we use the
  Zipf-Mandelbrot form P(k) ~ (k + q)^-theta on 1..32,000 with the offset q chosen for the
  mean tokens per request read off the author figures: ChatGPT-Conv 640, GPT-4-Conv 740,
  ChatGPT-API ~500, GPT-4-API ~700 (D, low confidence); theta = 4.3 (Conversation) and 5.0
  (API) are G, set so the median and p99 land near third-party percentiles (C).
- Response tokens, Conversation: lognormal around the conditional median of the authors'
  Fig. 4 (request -> median response, eyeballed, A: a bump for very short requests, then
  roughly +0.2 response tokens per request token), sigma 0.7 / 0.8 (G, from the figure's
  90 % band). The published "bimodal" shape has no parameters (B) and is not modeled.
  API: no author figure of response vs request; lognormal independent of the request with
  median 20 (ChatGPT-API) or 60 / 250 at 01-06 h (GPT-4-API, whose response tokens burst
  at night, A), sigma 1.5 (G; D from the throughput figures: ~60 tokens per request).
  Responses are capped at 12,500 tokens (largest in the public viewer, C).
- Failures (0 response tokens) at 1.78 % of requests, uniformly (D: README counts
  1,429.7k vs 1,404.3k without failures); they are dropped and counted as
  ``failed_response`` exactly as the real adapter drops them.

A window is the first `rows` kept requests at or after `start_s` of one virtual, endless
modeled trace defined by `seed`: every 20-min segment of every stream draws from its own
random stream seeded by (seed, stream, segment), so windows are cuts of the same trace and
a window does not depend on where another one starts. arrival_s is relative to `start_s`,
as the real adapter's is with ``start_s``.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache

import numpy as np

from schedport.errors import ConfigError, DataError
from schedport.workload.sources._common import FAILED, AdapterResult
from schedport.workload.trace import Trace

NAME = "burstgpt-modeled"
LABEL = "modeled BurstGPT (parameters partly guessed)"
CITATION = ("modeled from the BurstGPT authors' published characterization: Wang et al., "
            "'BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems', KDD 2025 "
            "(arXiv 2401.17644) and github.com/HPMLL/BurstGPT (README, figures, generator code); "
            "parameters partly guessed (see schedport.sources.burstgpt_model)")
SEGMENT_S = 1200  # 20-minute Gamma windows (the authors' Modeled Scaling)
DAY_S = 86400
#: Corpus-spec options of the modeled source (``options = {...}``): what stays guessed, to sweep.
MODEL_OPTIONS = ("api_share", "api_arrival_cv", "api_response_median")
SELECTION_KEYS = ("start_s", "rows", "seed", "max_days", *MODEL_OPTIONS)

_CHATGPT_CONV_PER_H = [45, 28, 17, 8, 6, 5, 5, 5, 21, 106, 158, 158,
                       68, 92, 155, 185, 188, 132, 78, 102, 118, 107, 94, 76]
_GPT4_CONV_PER_H = [25, 18, 8, 5, 4, 4, 3, 3, 8, 36, 66, 68,
                    27, 39, 67, 85, 85, 67, 40, 49, 58, 56, 52, 45]
_GPT4_API_SHAPE = [2.0] * 5 + [0.25] * 5 + [1.0] * 14  # elevated 00-04 h, sparse 05-09 h


def _flat_per_hour(per_day: float) -> list[float]:
    return [per_day / 24.0] * 24


def _shaped_per_hour(per_day: float, shape: list[float]) -> list[float]:
    total = float(sum(shape))
    return [per_day * s / total for s in shape]


#: The Conversation stream fit to the real BurstGPT rows of the data mirror (the first 400 rows of
#: BurstGPT_1.csv and BurstGPT_3.csv: 774 Conversation rows with tokens, 792 in all), as
#: `schedport.workload.modelcheck.fit_to_rows` computes it (a test recomputes it): per model the
#: request and response tokens at the percentiles `knots` (interpolated in log space) and the
#: input-output Spearman correlation; the GPT-4 share of Conversation requests; the failure share.
FIT: dict = {
    "knots": [0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100],
    "ChatGPT": {
        "request": [8.0, 19.0, 24.0, 49.2, 100.8, 179.4, 299.0, 437.8, 585.2, 851.4, 1290.8, 1526.8,
                    1905.2, 2573.0],
        "response": [2.0, 11.3, 16.6, 34.2, 57.0, 90.0, 140.0, 194.0, 271.2, 342.0, 488.4, 686.8,
                     1362.0, 2019.0],
        "rank_correlation": 0.2378},
    "GPT-4": {
        "request": [12.0, 20.0, 28.6, 66.0, 183.4, 320.8, 432.0, 540.2, 753.0, 984.8, 1576.8, 2086.7,
                    12751.2, 25085.0],
        "response": [2.0, 19.9, 25.6, 55.6, 79.0, 127.4, 214.0, 291.0, 369.8, 466.8, 552.4, 729.2,
                     849.5, 879.0],
        "rank_correlation": 0.0715},
    "gpt4_share": 0.2158,
    "failure_fraction": 0.0227,
}


def _conv_scale(share: float) -> tuple[float, float]:
    """Rate factors of (ChatGPT, GPT-4) Conversation that give GPT-4 `share` of its requests while
    keeping the published total (both streams share the weekend factor, so daily sums decide)."""
    a, b = float(sum(_CHATGPT_CONV_PER_H)), float(sum(_GPT4_CONV_PER_H))
    return round((1.0 - share) * (a + b) / a, 6), round(share * (a + b) / b, 6)


_CONV_SCALE = _conv_scale(FIT["gpt4_share"])

#: What each parameter rests on: published (author artifacts, paper sentences quoted by third
#: parties, and arithmetic on them: tiers A, B, D of burstgpt-published-model.md), fit-to-rows
#: (`FIT`, the real rows of the mirror) or guessed (tier G, or set from third-party numbers, C).
PARAMETER_LABELS: dict = {
    "streams (Model x Log Type), client ids": "published",
    "segment_s (20-min Gamma windows)": "published",
    "first_day_weekday": "guessed",
    "Conversation weekday_per_hour, weekend_factor (diurnal and weekly shape, total rate)": "published",
    "Conversation rate_scale (GPT-4 share of Conversation)": "fit-to-rows",
    "Conversation gamma_shape (arrival CV)": "guessed",
    "Conversation day_sigma, segment_sigma": "guessed",
    "Conversation request tokens (log-quantile knots)": "fit-to-rows",
    "Conversation response tokens (log-quantile knots)": "fit-to-rows",
    "Conversation input-output rank correlation (Gaussian copula)": "fit-to-rows",
    "Conversation failure_fraction": "fit-to-rows",
    "API weekday_per_hour (ChatGPT 17.9k/day, GPT-4 3.0k/day; the API share)": "guessed",
    "API total rate (1,429.7k rows / 61 days minus Conversation)": "published",
    "API GPT-4 night shape": "published",
    "API gamma_shape 0.5 (arrival CV 1.41)": "published",
    "API day_sigma, segment_sigma": "guessed",
    "API request tokens (Zipf-Mandelbrot family, means)": "published",
    "API request tokens theta": "guessed",
    "API response tokens (lognormal medians 20 / 60-250, sigma 1.5)": "guessed",
    "API failure_fraction 1.78 %": "published",
    "max_request_tokens, max_response_tokens": "guessed",
}

#: Every model parameter (JSON-able; its sha256 is the modeled source's "origin" hash).
DEFAULT_PARAMS: dict = {
    "model": NAME,
    "version": 2,
    "label": LABEL,
    "parameter_labels": PARAMETER_LABELS,
    "segment_s": SEGMENT_S,
    "first_day_weekday": 0,  # day 0 is a Monday (G)
    "failure_fraction": 0.0178,  # D: README 1,429.7k rows vs 1,404.3k without failures (API streams)
    "max_request_tokens": 32000,  # C: largest request in the public viewer is 31.4k
    "max_response_tokens": 12500,  # C: largest response in the public viewer
    "streams": [
        {
            "client_id": "ChatGPT/Conversation log",
            "weekday_per_hour": _CHATGPT_CONV_PER_H,  # A: Fig. daily periodicity, medians
            "weekend_factor": 0.5,  # A: weekly heatmap, eyeballed
            "rate_scale": _CONV_SCALE[0],  # fit-to-rows: GPT-4 share of Conversation
            "gamma_shape": 1.0,  # G (third-party CV 0.92, C)
            "day_sigma": 0.2,  # G
            "segment_sigma": 0.25,  # G
            "failure_fraction": FIT["failure_fraction"],  # fit-to-rows
            "request": {"family": "log-quantile", "knots": FIT["knots"],
                        "tokens": FIT["ChatGPT"]["request"]},  # fit-to-rows
            "response": {"family": "copula-log-quantile", "knots": FIT["knots"],
                         "tokens": FIT["ChatGPT"]["response"],
                         "rank_correlation": FIT["ChatGPT"]["rank_correlation"]},  # fit-to-rows
        },
        {
            "client_id": "GPT-4/Conversation log",
            "weekday_per_hour": _GPT4_CONV_PER_H,
            "weekend_factor": 0.5,
            "rate_scale": _CONV_SCALE[1],
            "gamma_shape": 1.0,
            "day_sigma": 0.2,
            "segment_sigma": 0.25,
            "failure_fraction": FIT["failure_fraction"],
            "request": {"family": "log-quantile", "knots": FIT["knots"],
                        "tokens": FIT["GPT-4"]["request"]},
            "response": {"family": "copula-log-quantile", "knots": FIT["knots"],
                         "tokens": FIT["GPT-4"]["response"],
                         "rank_correlation": FIT["GPT-4"]["rank_correlation"]},
        },
        {
            "client_id": "ChatGPT/API log",
            "weekday_per_hour": _flat_per_hour(17900.0),  # D/G: aperiodic, ~17.9k/day
            "weekend_factor": 1.0,  # A: no weekly pattern for API
            "gamma_shape": 0.5,  # A: the authors' generator default Gamma(0.5, 2)
            "day_sigma": 0.8,  # G: days swing from <1k to >=28k requests (A)
            "segment_sigma": 0.6,  # G
            "request": {"family": "zipf-mandelbrot", "theta": 5.0, "q": 1498.5,
                        "target_mean": 500},
            "response": {"family": "lognormal", "sigma": 1.5, "median_by_hour": [20] * 24},
        },
        {
            "client_id": "GPT-4/API log",
            "weekday_per_hour": _shaped_per_hour(3000.0, _GPT4_API_SHAPE),
            "weekend_factor": 1.0,
            "gamma_shape": 0.5,
            "day_sigma": 0.8,
            "segment_sigma": 0.6,
            "request": {"family": "zipf-mandelbrot", "theta": 5.0, "q": 2099.8,
                        "target_mean": 700},
            # A: GPT-4 API response tokens large only 01-06 h (throughput figure)
            "response": {"family": "lognormal", "sigma": 1.5,
                         "median_by_hour": [60] + [250] * 6 + [60] * 17},
        },
    ],
}


def _weekly(st: dict) -> float:
    """Expected requests of a stream over a week (five weekdays, two weekend days)."""
    return sum(st["weekday_per_hour"]) * (5.0 + 2.0 * float(st["weekend_factor"])) * float(st.get("rate_scale", 1.0))


def _is_api(st: dict) -> bool:
    return st["client_id"].endswith("/API log")


def api_share(params: dict | None = None) -> float:
    """The API streams' expected share of the modeled trace's requests over a week."""
    p = DEFAULT_PARAMS if params is None else params
    api = sum(_weekly(st) for st in p["streams"] if _is_api(st))
    return api / (api + sum(_weekly(st) for st in p["streams"] if not _is_api(st)))


def with_options(params: dict | None = None, options: dict | None = None) -> dict:
    """The model parameters with the corpus spec's `options` applied (a new dict; none: unchanged).

    ``api_share``: ``"published"`` (the published/guessed API rates: 0.895 of a week's requests)
    or a number in [0, 1): the API streams' rates are scaled by one factor so they make up that
    share of a week's requests (0 = Conversation only, as the real rows look). ``api_arrival_cv``:
    the API streams' Gamma inter-arrival CV (shape 1/CV^2; published 1.41). ``api_response_median``:
    ChatGPT-API's median response tokens (published-derived 20), GPT-4-API's scaled with it.
    Bad values are one-line `ConfigError`s. The options are recorded under ``options``.
    """
    p = json.loads(json.dumps(DEFAULT_PARAMS if params is None else params))
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(MODEL_OPTIONS))
    if unknown:
        raise ConfigError(f"{NAME}: unknown option(s) {', '.join(unknown)} (accepted: {', '.join(MODEL_OPTIONS)})")
    if not opts:
        return p

    def num(k, lo, hi=None):
        v = opts[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < lo \
                or (hi is not None and v >= hi) or (lo > 0 and v <= 0):
            rng = f"in [{lo:g}, {hi:g})" if hi is not None else "> 0"
            raise ConfigError(f"{NAME}: option {k} must be a number {rng}, not {v!r}")
        return float(v)

    api = [st for st in p["streams"] if _is_api(st)]
    if "api_share" in opts and opts["api_share"] != "published":
        if isinstance(opts["api_share"], str):
            raise ConfigError(f"{NAME}: option api_share must be \"published\" or a number in [0, 1), "
                              f"not {opts['api_share']!r}")
        share = num("api_share", 0.0, 1.0)
        conv = sum(_weekly(st) for st in p["streams"] if not _is_api(st))
        now = sum(_weekly(st) for st in api)
        factor = share / (1.0 - share) * conv / now
        for st in api:
            st["rate_scale"] = round(float(st.get("rate_scale", 1.0)) * factor, 9)
    if "api_arrival_cv" in opts:
        cv = num("api_arrival_cv", 1e-9)
        for st in api:
            st["gamma_shape"] = round(1.0 / (cv * cv), 9)
    if "api_response_median" in opts:
        m = num("api_response_median", 1e-9)
        base = float(api[0]["response"]["median_by_hour"][0]) if api else 1.0
        for st in api:
            st["response"]["median_by_hour"] = [round(v * m / base, 6) for v in st["response"]["median_by_hour"]]
    p["options"] = opts
    return p


def params_sha256(params: dict | None = None) -> str:
    """sha256 of the canonical JSON of the model parameters: the modeled source's origin hash."""
    p = DEFAULT_PARAMS if params is None else params
    canon = json.dumps(p, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


@lru_cache(maxsize=16)
def _zm_cdf(q: float, theta: float, kmax: int) -> np.ndarray:
    """Cumulative probabilities of Zipf-Mandelbrot P(k) ~ (k + q)^-theta, k = 1..kmax."""
    k = np.arange(1, kmax + 1, dtype=np.float64)
    w = (k + q) ** (-theta)
    c = np.cumsum(w)
    c /= c[-1]
    c[-1] = 1.0
    c.flags.writeable = False
    return c


def _log_quantile(spec: dict, u: np.ndarray, cap: int) -> np.ndarray:
    """Tokens at probabilities `u`: the knots' log tokens interpolated linearly in probability."""
    x = np.exp(np.interp(u * 100.0, np.asarray(spec["knots"], dtype=np.float64),
                         np.log(np.asarray(spec["tokens"], dtype=np.float64))))
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def _sample_copula(rng: np.random.Generator, st: dict, n: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """Request and response tokens from their fit-to-rows quantiles, joined by a Gaussian copula
    whose correlation 2 sin(pi rho_s / 6) gives the fitted Spearman correlation rho_s."""
    from scipy.special import ndtr

    rho = 2.0 * math.sin(math.pi * float(st["response"]["rank_correlation"]) / 6.0)
    z1 = rng.standard_normal(n)
    z2 = rho * z1 + math.sqrt(1.0 - rho * rho) * rng.standard_normal(n)
    req = _log_quantile(st["request"], ndtr(z1), int(params["max_request_tokens"]))
    resp = _log_quantile(st["response"], ndtr(z2), int(params["max_response_tokens"]))
    return req, resp


def _sample_requests(rng: np.random.Generator, spec: dict, kmax: int, n: int) -> np.ndarray:
    cdf = _zm_cdf(float(spec["q"]), float(spec["theta"]), int(kmax))
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    return np.minimum(idx, kmax - 1).astype(np.int64) + 1


def _conditional_median(spec: dict, req: np.ndarray) -> np.ndarray:
    pts = np.asarray(spec["median_at_request"], dtype=np.float64)
    x, y = pts[:, 0], pts[:, 1]
    med = np.interp(req.astype(np.float64), x, y)
    beyond = req > x[-1]
    med[beyond] = y[-1] + float(spec["slope_beyond"]) * (req[beyond] - x[-1])
    return np.minimum(med, float(spec["median_cap"]))


def _sample_responses(rng: np.random.Generator, spec: dict, req: np.ndarray, hour: int,
                      cap: int) -> np.ndarray:
    n = len(req)
    if spec["family"] == "lognormal-conditional":
        med = _conditional_median(spec, req)
    elif spec["family"] == "lognormal":
        med = np.full(n, float(spec["median_by_hour"][hour]))
    else:  # pragma: no cover - DEFAULT_PARAMS only uses the two above
        raise ConfigError(f"{NAME}: unknown response family {spec['family']!r}")
    x = med * np.exp(float(spec["sigma"]) * rng.standard_normal(n))
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def _mean_one_lognormal(rng: np.random.Generator, sigma: float) -> float:
    return float(math.exp(sigma * rng.standard_normal() - 0.5 * sigma * sigma))


def _day_level(seed: int, j: int, day: int, sigma: float) -> float:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2, j, day]))
    return _mean_one_lognormal(rng, sigma)


def _renewal(rng: np.random.Generator, shape: float, mean_gap: float, t0: float,
             t1: float) -> np.ndarray:
    """Stationary Gamma renewal arrivals in [t0, t1): equilibrium first arrival, then gaps."""
    scale = mean_gap / shape
    first = t0 + rng.uniform() * rng.gamma(shape + 1.0, scale)
    if first >= t1:
        return np.empty(0)
    expected = (t1 - first) / mean_gap
    n = int(expected * 1.3 + 5.0 * math.sqrt(expected) + 16)
    t = first + np.concatenate(([0.0], np.cumsum(rng.gamma(shape, scale, n))))
    while t[-1] < t1:
        more = t[-1] + np.cumsum(rng.gamma(shape, scale, n))
        t = np.concatenate((t, more))
    return t[t < t1]


def _segment(params: dict, seed: int, j: int, s: int) -> tuple[np.ndarray, ...]:
    """Arrivals, lengths and failure flags of stream `j` in 20-min segment `s` (absolute)."""
    st = params["streams"][j]
    seg = int(params["segment_s"])
    t0 = s * seg
    day = t0 // DAY_S
    hour = (t0 % DAY_S) // 3600
    weekday = (day + int(params["first_day_weekday"])) % 7
    base = float(st["weekday_per_hour"][hour]) * (float(st["weekend_factor"]) if weekday >= 5 else 1.0) \
        * float(st.get("rate_scale", 1.0))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, j, s]))
    mult = _mean_one_lognormal(rng, float(st["segment_sigma"]))
    rate = base * _day_level(seed, j, day, float(st["day_sigma"])) * mult / 3600.0
    if not rate > 0:
        e = np.empty(0)
        return e, e.astype(np.int64), e.astype(np.int64), e.astype(bool)
    t = _renewal(rng, float(st["gamma_shape"]), 1.0 / rate, float(t0), float(t0 + seg))
    n = len(t)
    if st["response"]["family"] == "copula-log-quantile":
        req, resp = _sample_copula(rng, st, n, params)
    else:
        req = _sample_requests(rng, st["request"], int(params["max_request_tokens"]), n)
        resp = _sample_responses(rng, st["response"], req, int(hour), int(params["max_response_tokens"]))
    failed = rng.random(n) < float(st.get("failure_fraction", params["failure_fraction"]))
    return t, req, resp, failed


CONVERSATION = "Conversation log"


def conversation_sample(params: dict | None = None, *, seed: int = 0, days: int = 14) -> dict:
    """The modeled Conversation streams over the first `days` days of the virtual trace `seed`.

    Returns ``{"model": labels, "request", "response": tokens, "failed": bool}``, one entry per
    generated request (failures included, with the lengths drawn for them), in stream order.
    This is what the fidelity check (`schedport.workload.modelcheck`) holds against the real
    Conversation rows: the same segments the windows are cut from, without the API streams.
    """
    p = DEFAULT_PARAMS if params is None else params
    seg = int(p["segment_s"])
    out: dict[str, list] = {"model": [], "request": [], "response": [], "failed": []}
    for j, st in enumerate(p["streams"]):
        model, _, log_type = st["client_id"].partition("/")
        if log_type != CONVERSATION:
            continue
        for s in range(int(days) * DAY_S // seg):
            t, req, resp, failed = _segment(p, seed, j, s)
            out["model"].append(np.full(len(t), model, dtype=object))
            out["request"].append(req)
            out["response"].append(resp)
            out["failed"].append(failed)
    return {k: np.concatenate(v) if v else np.empty(0) for k, v in out.items()}


_OPTIONS_CACHE: dict = {}


def _options_cached(key: str, opts: str, params: dict) -> dict:
    """`with_options` once per (params, options) in a process: 40 windows share one parameter set."""
    k = (key, opts)
    if k not in _OPTIONS_CACHE:
        _OPTIONS_CACHE[k] = with_options(params, json.loads(opts))
    return _OPTIONS_CACHE[k]


def _check(selection: dict) -> dict:
    unknown = sorted(set(selection) - set(SELECTION_KEYS))
    if unknown:
        raise ConfigError(f"{NAME}: unknown selection option(s) {', '.join(unknown)} "
                          f"(accepted: {', '.join(SELECTION_KEYS)})")
    s = dict(selection)
    start = s.get("start_s", 0)
    if not isinstance(start, (int, float)) or isinstance(start, bool) or not math.isfinite(start) \
            or start < 0:
        raise ConfigError(f"{NAME}: start_s must be a finite number >= 0, not {start!r}")
    for k, default in (("rows", 1000), ("seed", 0)):
        v = s.get(k, default)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < (1 if k == "rows" else 0):
            raise ConfigError(f"{NAME}: {k} must be an integer >= {1 if k == 'rows' else 0}, not {v!r}")
        s[k] = int(v)
    md = s.get("max_days", 60)
    if not isinstance(md, (int, float)) or isinstance(md, bool) or not md > 0:
        raise ConfigError(f"{NAME}: max_days must be a number > 0, not {md!r}")
    s["start_s"], s["max_days"] = float(start), float(md)
    return s


def generate(params: dict | None = None, **selection) -> AdapterResult:
    """One modeled-BurstGPT window: the first `rows` kept requests at or after `start_s`.

    Selection: ``start_s`` (seconds from 0:00 of day 0 of the virtual trace, default 0),
    ``rows`` (default 1000), ``seed`` (the virtual trace; default 0), ``max_days`` (give up
    with a `DataError` if the window would need more than this many days; default 60).
    Returns an `AdapterResult` like the real adapter's: client ids ``<Model>/<Log Type>``,
    failures dropped and counted as ``failed_response``, ``origin`` naming the model
    parameters (their sha256), ``notes`` saying it is modeled. Same inputs, same output.
    """
    sel = _check(selection)
    options = {k: sel.pop(k) for k in MODEL_OPTIONS if k in sel}
    p = DEFAULT_PARAMS if params is None else params
    if options:
        p = _options_cached(params_sha256(p) if params is not None else "", json.dumps(options, sort_keys=True),
                            p)
    start, rows, seed = sel["start_s"], sel["rows"], sel["seed"]
    seg = int(p["segment_s"])
    nstreams = len(p["streams"])
    s = int(start // seg)
    ts, reqs, resps, fails, who = [], [], [], [], []
    kept = 0
    while kept < rows:
        if s * seg - start > sel["max_days"] * DAY_S:
            raise DataError(f"{NAME}: fewer than {rows} requests within {sel['max_days']:g} days "
                            f"after start_s={start:g} (model parameters give too low a rate)")
        for j in range(nstreams):
            t, req, resp, failed = _segment(p, seed, j, s)
            m = t >= start
            if not m.any():
                continue
            ts.append(t[m])
            reqs.append(req[m])
            resps.append(resp[m])
            fails.append(failed[m])
            who.append(np.full(int(m.sum()), j, dtype=np.int64))
            kept += int((~failed[m]).sum())
        s += 1
    t = np.concatenate(ts)
    order = np.argsort(t, kind="stable")
    t = t[order]
    req = np.concatenate(reqs)[order]
    resp = np.concatenate(resps)[order]
    failed = np.concatenate(fails)[order]
    owner = np.concatenate(who)[order]
    ok = np.flatnonzero(~failed)
    last = int(ok[rows - 1])
    window = slice(0, last + 1)
    keep = ok[: rows]
    n_failed = int(failed[window].sum())
    names = np.array([st["client_id"] for st in p["streams"]], dtype=object)
    trace = Trace(arrival_s=(t[keep] - start).astype(np.float64) + 0.0,
                  input_tokens=req[keep].astype(np.int64),
                  output_tokens=resp[keep].astype(np.int64),
                  client_id=names[owner[keep]], name=f"{NAME}-{int(start)}")
    origin = [{"name": f"{NAME} model parameters v{p['version']}", "sha256": params_sha256(p)}]
    notes = [f"{LABEL}: not the real BurstGPT trace; generated from the authors' published "
             f"characterization with seed {seed}, window from {start:g} s (day {int(start // DAY_S)}, "
             f"{int(start % DAY_S // 3600):02d}:00) of the virtual trace"]
    return AdapterResult(trace=trace, dropped={FAILED: n_failed}, skipped=[], origin=origin,
                         notes=notes)
