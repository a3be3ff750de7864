"""Fidelity check: the modeled BurstGPT's Conversation stream held against real BurstGPT rows.

The modeled source (`schedport.workload.sources.burstgpt_model`) is built from what the BurstGPT
authors published. Real rows now exist in the data mirror (``burstgpt-slices/``: the first 400
rows of ``BurstGPT_1.csv`` and of ``BurstGPT_3.csv``, read through the real adapter,
`schedport.workload.sources.burstgpt.read_records`). They are 98 % Conversation log, so they speak
for the Conversation stream only: its lengths, its model mix and its failure share; not for the
API stream, the API share or the arrival process (400 rows over ten hours form no load window).

`check_model` compares, per model (ChatGPT, GPT-4) and over the whole Conversation stream:

- input and output tokens: p10/p50/p90/p99 and the two-sample Kolmogorov-Smirnov distance
  (`scipy.stats.ks_2samp`) between the real kept rows and a modeled sample;
- the input-output Spearman rank correlation;
- the GPT-4 share of kept Conversation requests and the failure share (0 response tokens) of
  all Conversation requests;
- from the rows with a Session ID (BurstGPT_3): requests per session and the gaps between
  consecutive requests of a session (reported; the generator has no sessions to compare).

The rule (`RULE`): the model **matches** when every KS distance is below
``max(0.1, c(0.05) * sqrt((n + m) / (n m)))`` (0.1, or the two-sample KS 5 % critical value where
few real rows make that larger: GPT-4), and every modeled rank correlation and share lies inside
the real rows' own 95 % bootstrap interval (percentile, `N_BOOT` resamples of rows, fixed seed);
otherwise it **does not match**. Same inputs and seed give the same result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from schedport.errors import ConfigError, DataError

SLICES_DIR = "burstgpt-slices"
SLICE_FILES = ("BurstGPT_1.first400.csv", "BurstGPT_3.first400.csv")
CONVERSATION = "Conversation log"
MODELS = ("ChatGPT", "GPT-4")
QUANTILES = (10, 50, 90, 99)
KS_BOUND = 0.1
KS_ALPHA = 0.05
N_BOOT = 2000
BOOT_SEED = 20240131
MODEL_DAYS = 14
#: Fewest kept Conversation rows of ChatGPT or GPT-4 the check gives a verdict on: with fewer, the
#: two-sample KS 5% critical value passes 0.25 (a quarter of the whole distribution) and a share's
#: bootstrap interval is a handful of rows wide, so no verdict would tell a model from the rows.
MIN_ROWS = 30
RULE = ("matches when every KS distance (input and output tokens, per model and overall) is below "
        "max(0.1, the two-sample KS 5% critical value 1.358*sqrt((n+m)/(n*m))), and every modeled "
        "input-output Spearman correlation, the GPT-4 share and the failure share lie inside the real "
        "rows' 95% bootstrap interval; sessions are reported, not judged (the generator has none)")


@dataclass(frozen=True)
class LengthCheck:
    """One length distribution compared: `model` ("all" = the whole Conversation stream), `length`
    ("input" or "output"), quantiles (p10, p50, p90, p99) of each side, KS distance, its bound."""

    model: str
    length: str
    n_real: int
    n_modeled: int
    real_q: list[float]
    modeled_q: list[float]
    ks: float
    bound: float
    ok: bool


@dataclass(frozen=True)
class IntervalCheck:
    """A statistic of the real rows with its 95 % bootstrap interval, and the modeled value."""

    name: str
    model: str
    real: float
    lo: float
    hi: float
    modeled: float
    ok: bool


@dataclass(frozen=True)
class ModelCheck:
    """The fidelity check's result (see the module docstring); `as_dict` is JSON-ready."""

    verdict: str
    rule: str
    lengths: list[LengthCheck]
    intervals: list[IntervalCheck]
    sessions: dict
    real: dict
    modeled: dict
    notes: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        """Whether the verdict is "matches"."""
        return self.verdict == "matches"

    def as_dict(self) -> dict:
        """Plain JSON-able dict (what the corpus manifest records under ``fidelity``)."""
        d = asdict(self)
        return _round(d)


def _round(x):
    if isinstance(x, float):
        return round(x, 6) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def default_rows(data_dir: str | Path | None = None) -> list[Path]:
    """The mirror's BurstGPT slices (``<data dir>/burstgpt-slices/``); a missing one is a `DataError`."""
    from schedport.workload.datadir import resolve_data_dir

    root = resolve_data_dir(None if data_dir is None else str(data_dir))
    paths = [root / SLICES_DIR / f for f in SLICE_FILES]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p.name}: not found in {root / SLICES_DIR} (the BurstGPT slices of the data "
                            "mirror); give real BurstGPT CSVs with --rows")
    return paths


def ks_bound(n: int, m: int) -> float:
    """max(0.1, the asymptotic two-sample KS critical value at 5 %: sqrt(-ln(0.025)/2) sqrt((n+m)/(nm)))."""
    c = math.sqrt(-math.log(KS_ALPHA / 2) / 2)
    return max(KS_BOUND, c * math.sqrt((n + m) / (n * m)))


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of 2-D arrays (average ranks for ties)."""
    from scipy.stats import rankdata

    rx = rankdata(x, axis=1)
    ry = rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / den


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation of two samples (`scipy.stats.spearmanr`)."""
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def _boot_spearman(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    out = []
    n = len(x)
    for start in range(0, N_BOOT, 100):
        idx = rng.integers(0, n, size=(min(100, N_BOOT - start), n))
        out.append(_spearman_rows(x[idx].astype(float), y[idx].astype(float)))
    b = np.concatenate(out)
    lo, hi = np.nanpercentile(b, [2.5, 97.5])
    return float(lo), float(hi)


_INTERVALS: dict = {}


def _spearman_interval(key: tuple, model: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The real rows' bootstrap interval of the rank correlation, computed once per files and model
    in a process (it depends on the real rows only, and is the check's costly part)."""
    k = (key, model)
    if k not in _INTERVALS:
        _INTERVALS[k] = _boot_spearman(x, y, np.random.default_rng([BOOT_SEED, len(x)]))
    return _INTERVALS[k]


def _boot_share(flags: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    b = rng.binomial(len(flags), float(flags.mean()), size=N_BOOT) / len(flags)  # resampling rows of a 0/1 column
    lo, hi = np.percentile(b, [2.5, 97.5])
    return float(lo), float(hi)


def session_stats(rec) -> dict:
    """Requests per session and gaps between a session's consecutive requests (rows with a Session ID)."""
    has = np.array([s is not None for s in rec.session], dtype=bool)
    if not has.any():
        return {"available": False, "note": "no row has a Session ID (BurstGPT_3's layout has them)"}
    sid = rec.session[has].astype(str)
    t = rec.timestamp[has]
    uniq, inv, counts = np.unique(sid, return_inverse=True, return_counts=True)
    order = np.lexsort((t, inv))
    same = inv[order][1:] == inv[order][:-1]
    gaps = np.diff(t[order])[same]
    q = [float(v) for v in np.percentile(gaps, [10, 50, 90])] if len(gaps) else [None] * 3
    return {"available": True, "n_rows": int(has.sum()), "n_sessions": int(len(uniq)),
            "requests_per_session": {"mean": float(counts.mean()), "p50": float(np.median(counts)),
                                     "p90": float(np.percentile(counts, 90)), "max": int(counts.max()),
                                     "single_share": float((counts == 1).mean())},
            "inter_turn_gap_s": {"n": int(len(gaps)), "p10": q[0], "p50": q[1], "p90": q[2]},
            "modeled": "not modeled: the generator draws every request independently (no sessions)",
            "note": "sessions are cut off at the rows' end, so their counts are lower bounds"}


def check_model(rows: list[str | Path] | None = None, *, data_dir: str | Path | None = None,
                params: dict | None = None, seed: int = 0, days: int = MODEL_DAYS) -> ModelCheck:
    """Hold the modeled source's Conversation stream against real BurstGPT rows; see the module docstring.

    `rows`: real BurstGPT CSV files (default: the mirror's slices, `default_rows`), read with the
    real adapter; zero-token rows count as failures and are left out of the lengths. `params`:
    the model parameters (default: the shipped ones); `seed` and `days` pick the modeled sample
    (`burstgpt_model.conversation_sample`). Returns a `ModelCheck` with the verdict under `RULE`.
    """
    from scipy.stats import ks_2samp

    from schedport.workload.sources import burstgpt, burstgpt_model

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed {seed}: the modeled sample's seed must be an integer >= 0")
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"days {days}: the modeled sample needs at least 1 day")
    paths = [Path(p) for p in (rows if rows else default_rows(data_dir))]
    rec = burstgpt.read_records(paths)
    conv = rec.log_type == CONVERSATION
    names = ", ".join(rec.files)
    if not conv.any():
        raise DataError(f"{names}: no Conversation log rows to check the model against")
    kept = conv & rec.kept
    usable = int((kept & np.isin(rec.model, MODELS)).sum())
    if usable < MIN_ROWS:
        others = sorted({str(m) for m in rec.model[conv]} - set(MODELS))
        why = (f"; the other rows are of {', '.join(others[:3])}{'...' if len(others) > 3 else ''}" if others else
               "; the rest have 0 tokens (failed)" if int(conv.sum()) > usable else "")
        raise DataError(f"{names}: {usable} Conversation row(s) of {' or '.join(MODELS)} with tokens{why}; the "
                        f"check needs at least {MIN_ROWS} to give a verdict (no verdict given)")
    p = burstgpt_model.DEFAULT_PARAMS if params is None else params
    sim = burstgpt_model.conversation_sample(p, seed=seed, days=days)
    sim_ok = ~sim["failed"]
    rng = np.random.default_rng(BOOT_SEED)
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    lengths: list[LengthCheck] = []
    intervals: list[IntervalCheck] = []
    for model in (*MODELS, "all"):
        rm = kept & (rec.model == model) if model != "all" else kept
        sm = sim_ok & (sim["model"] == model) if model != "all" else sim_ok
        if rm.sum() < 2 or sm.sum() < 2:
            continue
        real_io = (rec.request[rm], rec.response[rm])
        sim_io = (sim["request"][sm], sim["response"][sm])
        for k, length in enumerate(("input", "output")):
            a, b = real_io[k], sim_io[k]
            ks = float(ks_2samp(a, b).statistic)
            bound = ks_bound(len(a), len(b))
            lengths.append(LengthCheck(model, length, int(len(a)), int(len(b)),
                                       [float(v) for v in np.percentile(a, QUANTILES)],
                                       [float(v) for v in np.percentile(b, QUANTILES)], ks, bound, ks < bound))
        real_rho = spearman(*real_io)
        lo, hi = _spearman_interval(key, model, real_io[0], real_io[1])
        sim_rho = spearman(*sim_io)
        intervals.append(IntervalCheck("input-output Spearman", model, real_rho, lo, hi, sim_rho,
                                       lo <= sim_rho <= hi))
    gpt4 = rec.model[kept] == "GPT-4"
    lo, hi = _boot_share(gpt4, rng)
    sim_gpt4 = float((sim["model"][sim_ok] == "GPT-4").mean())
    intervals.append(IntervalCheck("GPT-4 share", "all", float(gpt4.mean()), lo, hi, sim_gpt4, lo <= sim_gpt4 <= hi))
    failed = rec.reason[conv] == "failed_response"
    lo, hi = _boot_share(failed, rng)
    sim_fail = float(sim["failed"].mean())
    intervals.append(IntervalCheck("failure share", "all", float(failed.mean()), lo, hi, sim_fail,
                                   lo <= sim_fail <= hi))
    ok = all(c.ok for c in lengths) and all(c.ok for c in intervals)
    real = {"files": [{"name": o["name"], "sha256": o["sha256"]} for o in rec.origin],
            "rows": int(len(rec.reason)), "conversation_rows": int(conv.sum()),
            "conversation_kept": int(kept.sum()), "api_rows": int((~conv).sum()),
            "dropped": {r: int((rec.reason[conv] == r).sum()) for r in burstgpt.DROP_REASONS}}
    modeled = {"params_sha256": burstgpt_model.params_sha256(p), "version": p.get("version"),
               "seed": int(seed), "days": int(days), "requests": int(len(sim["failed"])),
               "kept": int(sim_ok.sum())}
    notes = ["the real rows speak for the Conversation stream only (they hold "
             f"{real['api_rows']} API rows): the API stream, the API share and the arrival process are not checked"]
    return ModelCheck("matches" if ok else "does not match", RULE, lengths, intervals, session_stats(rec),
                      real, modeled, notes)


def fidelity_record(data_dir: str | Path | None = None, params: dict | None = None) -> dict:
    """What a corpus manifest records for a modeled source: the check's dict on the mirror's slices
    (``available`` true), or why it could not run (``available`` false and a note; a build never
    fails for want of the slices)."""
    from schedport.errors import SchedportError

    try:
        res = check_model(data_dir=data_dir, params=params)
    except SchedportError as e:
        return {"available": False, "note": f"fidelity check not run: {e}"}
    return {"available": True, **res.as_dict()}


KNOTS = (0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)


def fit_to_rows(rows: list[str | Path] | None = None, *, data_dir: str | Path | None = None) -> dict:
    """The modeled Conversation stream's fit-to-rows parameters, computed from real BurstGPT rows.

    Per model (ChatGPT, GPT-4), over the kept Conversation rows: the request- and response-token
    quantiles at `KNOTS` (percent; numpy's linear percentiles, rounded to 0.1 token), which the
    generator interpolates in log space, and the input-output Spearman correlation, which its
    Gaussian copula reproduces; over all Conversation rows, the GPT-4 share of kept requests and
    the failure share. `burstgpt_model.DEFAULT_PARAMS` holds these numbers for the mirror's slices
    (a test recomputes them), so the study does not need the rows at build time.
    """
    from schedport.workload.sources import burstgpt

    paths = [Path(p) for p in (rows if rows else default_rows(data_dir))]
    rec = burstgpt.read_records(paths)
    conv = rec.log_type == CONVERSATION
    kept = conv & rec.kept
    out: dict = {"knots": list(KNOTS), "models": {}}
    for model in MODELS:
        m = kept & (rec.model == model)
        x, y = rec.request[m], rec.response[m]
        out["models"][model] = {
            "n": int(m.sum()),
            "request": [round(float(v), 1) for v in np.percentile(x, KNOTS)],
            "response": [round(float(v), 1) for v in np.percentile(y, KNOTS)],
            "rank_correlation": round(spearman(x, y), 4)}
    out["gpt4_share"] = round(float((rec.model[kept] == "GPT-4").mean()), 4)
    out["failure_fraction"] = round(float((rec.reason[conv] == "failed_response").mean()), 4)
    return out
