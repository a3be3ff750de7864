"""Per-request outcome table and per-run summary metrics.

A simulated run produces, for every request of the trace, its status and the times of its
first and last output token. `request_table` turns those into the one-row-per-request table
written as ``requests.parquet``; `summarize` reduces that table to the flat dict written as
``summary.json`` and stored as one results-store row. Both are pure functions of their inputs.

Notation
--------
For request i: a_i = arrival, t1_i = first output token, f_i = last output token (finish),
N_i = output tokens, T_i = latency alone on an empty engine (``alone_s``, given by the caller
from the latency model). t0 = min_i a_i is the time origin (the first arrival of the trace,
rejected requests included). "Completed" means status == "completed".

Per-request columns (``request_table``)
---------------------------------------
- ``ttft_s``  = t1 - a, wherever a first token was emitted (also for unfinished requests that
  got one); NaN otherwise. Includes queueing and any re-prefill after a preemption.
- ``tpot_s``  = (f - t1) / (N - 1) for completed requests with N > 1 (vLLM benchmark
  semantics, request-weighted); NaN for N == 1 and for requests that did not complete.
- ``e2e_s``   = f - a for completed requests; NaN otherwise.

Run metrics (``summarize``)
---------------------------
Every offered request counts. The latency and fairness statistics used for ranking are over
*all* requests: a request that was rejected or did not finish is *censored at the end of
observation*, T_end = max(t0 + horizon_s, the last first-token or finish time of the run):
whatever it had not received by then is taken to arrive at T_end. So its

- TTFT is t1 - a if it got a first token, else T_end - a;
- E2E is f - a if it completed, else T_end - a;
- TPOT (N > 1) is the completed value, else (T_end - s) / (N - 1), s = t1 if it got a first
  token, else its arrival a (the stream stalled from s to the end of observation).

Censoring at T_end instead of counting +infinity keeps means and effect sizes finite (a mean
over a single infinite value would be infinite and every paired comparison degenerate), and
T_end is at least the last completion, so a rejected request never counts better than one
served last: a scheduler cannot improve these statistics by refusing requests. Rejected and
unfinished requests are also misses in ``slo_attainment_*`` and not good in ``goodput_*``.
The completed-only statistics stay as separately named columns, ``*_completed``.

- ``n_requests, n_completed, n_rejected, n_unfinished``: counts by status.
- ``makespan_s`` = max over completed f - t0; 0 if nothing completed.
- ``throughput_rps`` = n_completed / makespan_s; ``output_tokens_per_s`` = sum of N over
  completed / makespan_s. Both are 0 when nothing completed and None (undefined) in the
  degenerate case of completions with a zero makespan.
- ``backlog_at_last_arrival``: the share of the requests the engine accepted (not rejected)
  that had not had their first token when the last request arrived, i.e. were still queued.
  For a fluid queue started empty at offered load rho it is max(0, 1 - 1/rho); the study's
  regime check compares the two (`schedport.analysis.portability`, ``regimes``). None when every request
  was rejected.
- ``ttft_{mean,p50,p90,p99}_s``, ``e2e_{mean,p99}_s``: over every request, censored as above.
  ``tpot_{mean,p50,p99}_s``: over every request with N > 1, censored. Percentiles use numpy's
  default (linear interpolation between order statistics, NumPy's method 7, as in
  Hyndman & Fan 1996). None when the population is empty.
- ``norm_latency_mean_s`` = mean over every request of E2E / N, seconds per output token
  (the normalized latency of Orca and vLLM), censored E2E.
- ``slowdown_mean`` = mean over every request of E2E / T (censored E2E); ``slowdown_jain`` =
  Jain's fairness index of those per-request slowdowns.
- ``client_jain``: Jain's index over the per-client *mean* slowdown (censored), one value per
  client id. Requests without a client id are left out. None when the trace has fewer than
  two distinct client ids.
- ``*_completed`` (``ttft_{mean,p50,p90,p99}_completed_s``, ``tpot_{mean,p50,p99}_completed_s``,
  ``e2e_{mean,p99}_completed_s``, ``norm_latency_mean_completed_s``, ``slowdown_mean_completed``,
  ``slowdown_jain_completed``, ``client_jain_completed``): the same statistics over completed
  requests only (the study's metrics before censoring); ``client_jain_completed`` is None when
  fewer than two clients completed anything (a single value would read as perfectly fair).
- Jain's index (Jain, Chiu, Hawe, DEC-TR-301, 1984): J(x) = (sum x)^2 / (n * sum x^2), which
  lies in [1/n, 1] for non-negative x not all zero; 1 means all equal. Undefined (None) for
  an empty set or all zeros.
- ``horizon_s``: echoed. ``completed_within_horizon`` = completed requests with
  f - t0 <= horizon_s.
- SLO profile p = (ttft_slo, tpot_slo) in seconds. A request *meets* p when it completed,
  t1 - a <= ttft_slo, (N == 1 or tpot <= tpot_slo), and f - t0 <= horizon_s.
  ``slo_attainment_<p>`` = met / n_requests (rejected and unfinished requests are misses,
  as in DistServe; None for an empty trace). ``goodput_<p>_rps`` = met / horizon_s: request
  goodput at a fixed rate (vLLM's ``--goodput``, Mooncake), with the horizon as a fixed
  denominator so that schedulers run on the same window are comparable (dividing by each
  run's own makespan would reward a scheduler for finishing late).
  An infinite threshold switches that half of the SLO off.
- ``preemptions``, ``iterations``: engine counters copied from ``counters``; if
  ``preemptions`` is missing it is the sum of the per-request column, a missing
  ``iterations`` is None. Any other counter keys follow, in the order given.

JSON: every value is a plain Python int, float, str, bool or None. Any NaN or infinite float
becomes None, so ``json.dumps(summary, allow_nan=False)`` always succeeds. Keys come in the
order of `summary_keys` (fixed part, then SLO profiles in the order of ``slo_profiles``, then
``preemptions``, ``iterations`` and any extra counters), so results-store columns line up.

Performance: `summarize` is vectorised numpy with a single hash factorisation for the
per-client grouping and a one-sort percentile routine; about 0.6 ms for 1,000 requests
(it runs once per sweep cell, ~10,000 times per study).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from schedport.common.arrowcols import arrow_of
from schedport.common.values import json_scalar  # noqa: F401  (re-exported: the summary's scalar rule)
from schedport.errors import ConfigError

if TYPE_CHECKING:  # pandas is imported where a table is built: a simulation that only writes its files needs none
    import pandas as pd

REQUEST_COLUMNS = (
    "request_id",
    "client_id",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "status",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "preemptions",
)

STATUSES = ("completed", "rejected", "unfinished")

#: Extra outcomes a replay against a real server can record; like "unfinished", they never
#: completed, so they carry no finish time (a truncated stream may have a first token).
REPLAY_STATUSES = ("error", "timeout", "truncated")

# Keys that do not depend on the SLO profiles or the counters, in output order.
BASE_SUMMARY_KEYS = (
    "n_requests",
    "n_completed",
    "n_rejected",
    "n_unfinished",
    "makespan_s",
    "throughput_rps",
    "output_tokens_per_s",
    "backlog_at_last_arrival",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "e2e_p99_s",
    "norm_latency_mean_s",
    "slowdown_mean",
    "slowdown_jain",
    "client_jain",
    "horizon_s",
    "completed_within_horizon",
    "ttft_mean_completed_s",
    "ttft_p50_completed_s",
    "ttft_p90_completed_s",
    "ttft_p99_completed_s",
    "tpot_mean_completed_s",
    "tpot_p50_completed_s",
    "tpot_p99_completed_s",
    "e2e_mean_completed_s",
    "e2e_p99_completed_s",
    "norm_latency_mean_completed_s",
    "slowdown_mean_completed",
    "slowdown_jain_completed",
    "client_jain_completed",
)

COUNTER_KEYS = ("preemptions", "iterations")


def summary_keys(slo_profile_names: Sequence[str], extra_counters: Sequence[str] = ()) -> list[str]:
    """The keys `summarize` returns, in order, for these SLO profiles and extra counters.

    Lets a results store declare its columns before any run finishes.
    """
    keys = list(BASE_SUMMARY_KEYS)
    for name in slo_profile_names:
        keys += [f"slo_attainment_{name}", f"goodput_{name}_rps"]
    keys += list(COUNTER_KEYS)
    keys += [k for k in extra_counters if k not in COUNTER_KEYS]
    return keys


# --------------------------------------------------------------------------- request table


def _float_column(name: str, values, n: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},), got {arr.shape}")
    return arr


def _int_column(name: str, values, n: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},), got {arr.shape}")
    if n and not np.issubdtype(arr.dtype, np.integer):
        as_int = arr.astype(np.int64)
        if not np.array_equal(as_int, arr):
            raise ValueError(f"{name}: values must be integers")
        arr = as_int
    return arr.astype(np.int64, copy=False)


def request_table(**columns) -> pd.DataFrame:
    """The per-request outcome table (columns `REQUEST_COLUMNS`, in that order): `request_columns`
    as a DataFrame. Takes the same keyword arguments and raises the same errors."""
    return table_of(request_columns(**columns))


def table_of(columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """The DataFrame of `request_columns`' result (plus any further columns it was given, after
    them): ``client_id`` as str or None, ``client_id`` and ``status`` as object columns, so the
    table writes to Parquet unchanged."""
    import pandas as pd

    data = dict(columns)
    data["client_id"] = pd.Series(_client_names(data["client_id"]), dtype=object)
    data["status"] = pd.Series(data["status"], dtype=object)
    order = list(REQUEST_COLUMNS) + [c for c in data if c not in REQUEST_COLUMNS]
    return pd.DataFrame(data, columns=order)


#: Arrow type -> the ``pandas_type`` pandas' Parquet writer records for it (`arrow_table_of`).
_PANDAS_TYPES = {"null": "empty", "string": "unicode", "int64": "int64", "double": "float64"}


def arrow_table_of(columns: Mapping[str, Any]) -> Any:
    """The Arrow table that ``table_of(columns).to_parquet(path, index=False)`` writes, any
    further column added to the frame as an object column (`SimulationResult`'s ``reject_reason``),
    built without pandas; None where a column is of a type this does not cover (then write the
    DataFrame).

    The same columns in the same order and the same ``pandas`` schema metadata (each column's
    logical and NumPy type, the pyarrow and pandas versions), with NaN written as null as
    pandas' writer does, so `pyarrow.parquet.write_table` of it gives the same bytes and
    `pandas.read_parquet` the same DataFrame; a simulation writes its ``requests.parquet``
    through it without importing pandas (the start-up of one ``schedport simulate``).
    """
    import pyarrow as pa
    from importlib.metadata import PackageNotFoundError, version

    data = dict(columns)
    data["client_id"] = _client_names(data["client_id"])
    data["status"] = np.asarray(data["status"], dtype=object)
    order = list(REQUEST_COLUMNS) + [c for c in data if c not in REQUEST_COLUMNS]
    arrays, meta = [], []
    for name in order:
        col = np.asarray(data[name])
        arr = arrow_of(col)
        if arr is None:
            return None
        arrays.append(arr)
        meta.append({"name": name, "field_name": name, "pandas_type": _PANDAS_TYPES[str(arr.type)],
                     "numpy_type": str(col.dtype), "metadata": None})
    try:
        pandas_version = version("pandas")
    except PackageNotFoundError:
        return None
    pandas_meta = {"index_columns": [], "column_indexes": [], "columns": meta, "attributes": {},
                   "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": pandas_version}
    return pa.Table.from_arrays(arrays, names=order, metadata={b"pandas": json.dumps(pandas_meta).encode("utf8")})


def _client_names(clients: np.ndarray) -> np.ndarray:
    """Client ids as str, None where missing (None or NaN)."""
    return np.array([None if (c is None or (isinstance(c, float) and math.isnan(c))) else str(c)
                     for c in clients], dtype=object)


def request_columns(
    *,
    arrival_s,
    input_tokens,
    output_tokens,
    client_id,
    status,
    first_token_s,
    finish_s,
    preemptions,
    extra_statuses: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """The per-request outcome columns (`REQUEST_COLUMNS`, in that order), checked: what
    `summarize` reduces, without building a DataFrame (a sweep keeps only the summary).

    Inputs are equal-length arrays in trace order. ``status`` holds "completed", "rejected"
    or "unfinished" (or one of ``extra_statuses``, which follow the "unfinished" rules:
    a replay records server errors, timeouts and truncated streams this way); ``first_token_s`` /
    ``finish_s`` are NaN where not reached. ``client_id`` is None (no client column) or an array of
    client ids (None or NaN where missing; `table_of` writes them as str). Derived columns
    ``ttft_s``, ``tpot_s`` and ``e2e_s`` follow the module docstring. ``request_id`` is 0..n-1
    (int64).

    The engine's timing invariants are checked here, because a violation is an engine bug
    that would otherwise surface only as strange metrics: a completed request has
    arrival <= first token <= finish, a rejected one has neither time, an unfinished one no
    finish. Raises ValueError on any violation or on mismatched lengths.
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    if arrival.ndim != 1:
        raise ValueError(f"arrival_s: expected a 1-d array, got shape {arrival.shape}")
    n = arrival.shape[0]
    n_in = _int_column("input_tokens", input_tokens, n)
    n_out = _int_column("output_tokens", output_tokens, n)
    first = _float_column("first_token_s", first_token_s, n)
    finish = _float_column("finish_s", finish_s, n)
    n_pre = _int_column("preemptions", preemptions, n)

    st = np.asarray(status, dtype=object)
    if st.shape != (n,):
        raise ValueError(f"status: expected shape ({n},), got {st.shape}")
    completed = st == "completed"
    rejected = st == "rejected"
    unfinished = np.isin(st, ("unfinished", *extra_statuses))
    bad = ~(completed | rejected | unfinished)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"status: row {i} has {st[i]!r}; expected one of {STATUSES + tuple(extra_statuses)}")

    if client_id is None:
        clients = np.full(n, None, dtype=object)
    else:
        clients = np.asarray(client_id, dtype=object)
        if clients.shape != (n,):
            raise ValueError(f"client_id: expected shape ({n},), got {clients.shape}")

    if not np.isfinite(arrival).all():
        raise ValueError("arrival_s: values must be finite")
    if (n_out < 1).any():
        i = int(np.flatnonzero(n_out < 1)[0])
        raise ValueError(f"output_tokens: row {i} is {int(n_out[i])}; must be >= 1")
    has_first = np.isfinite(first)
    has_finish = np.isfinite(finish)
    checks = (
        (completed & ~(has_first & has_finish), "completed without first_token_s/finish_s"),
        (rejected & (has_first | has_finish), "rejected but has first_token_s/finish_s"),
        (unfinished & has_finish, "unfinished but has finish_s"),
        (~np.isnan(first) & ~has_first, "first_token_s is infinite"),
        (~np.isnan(finish) & ~has_finish, "finish_s is infinite"),
        (has_first & (first < arrival), "first_token_s before arrival_s"),
        (has_finish & (finish < first), "finish_s before first_token_s"),
        (n_pre < 0, "negative preemptions"),
    )
    for mask, what in checks:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise ValueError(f"request table row {i}: {what}")

    ttft = first - arrival  # NaN where no first token
    e2e = np.where(completed, finish - arrival, np.nan)
    multi = completed & (n_out > 1)
    denom = np.where(multi, n_out - 1, 1).astype(np.float64)
    tpot = np.where(multi, (finish - first) / denom, np.nan)

    return {
        "request_id": np.arange(n, dtype=np.int64),
        "client_id": clients,
        "arrival_s": arrival,
        "input_tokens": n_in,
        "output_tokens": n_out,
        "status": st,
        "first_token_s": first,
        "finish_s": finish,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "preemptions": n_pre,
    }


# --------------------------------------------------------------------------- summary


def jain_index(x) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2) of non-negative values.

    1 when all values are equal, 1/n when one value holds everything (Jain, Chiu, Hawe,
    DEC-TR-301, 1984). NaN when undefined: no values, or all zero.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return math.nan
    top = float(x.max())
    if top == 0.0:
        return math.nan
    x = x / top  # J is scale-free; scaling keeps x^2 from under- or overflowing
    s2 = float(np.dot(x, x))
    s = float(x.sum())
    return min(1.0, s * s / (n * s2))  # clamp rounding just above 1 for equal values


def percentiles(x, ps: Sequence[float]) -> list[float]:
    """Percentiles ``ps`` (in 0..100) of ``x`` by numpy's default linear method, as floats.

    Gives the same result as ``numpy.percentile(x, ps)`` (virtual index (n-1)·p/100 and
    the same two-sided interpolation formula, so results agree to the last bit) with one
    sort instead of numpy's per-call overhead, which dominates on the small arrays of a
    sweep. NaN for every percentile when ``x`` is empty.
    """
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = xs.shape[0]
    if n == 0:
        return [math.nan] * len(ps)
    out = []
    for p in ps:
        h = (n - 1) * (p / 100)
        lo = math.floor(h)
        if lo >= n - 1:
            out.append(float(xs[-1]))
            continue
        a, b = float(xs[lo]), float(xs[lo + 1])
        g = h - lo
        d = b - a
        out.append(b - d * (1 - g) if g >= 0.5 else a + d * g)
    return out


def _check_profiles(slo_profiles: Mapping[str, tuple[float, float]]) -> list[tuple[str, float, float]]:
    out = []
    for name, pair in slo_profiles.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"SLO profile name {name!r} must be a non-empty string")
        try:
            ttft_slo, tpot_slo = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO profile {name!r}: expected (ttft_s, tpot_s), got {pair!r}") from None
        if not (ttft_slo > 0 and tpot_slo > 0):  # also rejects NaN
            raise ConfigError(f"SLO profile {name!r}: thresholds must be > 0, got {pair!r}")
        out.append((name, ttft_slo, tpot_slo))
    return out


def summarize(
    table: pd.DataFrame | Mapping[str, np.ndarray],
    *,
    horizon_s: float,
    slo_profiles: dict[str, tuple[float, float]],
    alone_s: np.ndarray,
    counters: dict,
) -> dict:
    """Reduce a request table to the run's metrics: a flat, JSON-safe, ordered dict.

    ``table`` is a `request_table` result (or the same table read back from Parquet), or the
    `request_columns` it was built from.
    ``horizon_s`` is the observation horizon measured from the first arrival (finite, > 0).
    ``slo_profiles`` maps a profile name to (ttft_slo_s, tpot_slo_s). ``alone_s[i]`` is
    request i's latency alone on an empty engine (finite and > 0 for every request: the slowdowns
    count every request).
    ``counters`` holds engine totals (``preemptions``, ``iterations``, extras).
    Definitions, the NaN -> None rule and the key order are in the module docstring.
    """
    horizon = float(horizon_s)
    if not (math.isfinite(horizon) and horizon > 0):
        raise ConfigError(f"horizon_s must be finite and > 0, got {horizon_s!r}")
    profiles = _check_profiles(slo_profiles)

    def col(name: str, dtype=None) -> np.ndarray:
        return np.asarray(table[name], dtype=dtype)

    status = col("status", object)
    n = len(status)
    alone = np.asarray(alone_s, dtype=np.float64)
    if alone.shape != (n,):
        raise ValueError(f"alone_s: expected shape ({n},), got {alone.shape}")

    completed = status == "completed"
    n_completed = int(np.count_nonzero(completed))
    n_rejected = int(np.count_nonzero(status == "rejected"))
    n_unfinished = n - n_completed - n_rejected

    arrival = col("arrival_s", np.float64)
    first = col("first_token_s", np.float64)
    finish = col("finish_s", np.float64)
    n_out = col("output_tokens")
    ttft_all = col("ttft_s", np.float64)
    tpot_all = col("tpot_s", np.float64)
    e2e_all = col("e2e_s", np.float64)
    clients = _client_codes(col("client_id", object))

    t0 = float(arrival.min()) if n else 0.0
    if n and not (np.isfinite(alone) & (alone > 0)).all():
        raise ValueError("alone_s must be finite and > 0 for every request")
    nan = math.nan
    multi = n_out > 1

    # Every offered request, censored at the end of observation (module docstring).
    ttft_c, tpot_c, e2e_c = _censored(t0 + horizon, arrival, first, finish, completed, n_out,
                                      ttft_all, tpot_all, e2e_all)
    everyone = _latency_stats(ttft_c, tpot_c, e2e_c, n_out, alone)
    client_j = _client_jain(clients, np.ones(n, dtype=bool), everyone["slow"])

    # Completed requests only.
    tpot_done = tpot_all[completed & multi]
    done = _latency_stats(ttft_all[completed], tpot_done, e2e_all[completed], n_out[completed],
                          alone[completed])
    client_jc = _client_jain(clients, completed, done["slow"])

    makespan, thr, tok_thr = _throughput(finish, completed, n_out, t0, n_completed)

    within = completed & (finish - t0 <= horizon)
    accepted = status != "rejected"
    n_accepted = n - n_rejected
    out = {
        "n_requests": n,
        "n_completed": n_completed,
        "n_rejected": n_rejected,
        "n_unfinished": n_unfinished,
        "makespan_s": makespan,
        "throughput_rps": thr,
        "output_tokens_per_s": tok_thr,
        "backlog_at_last_arrival": (float(np.count_nonzero(~(first[accepted] <= arrival.max())))
                                    / n_accepted if n_accepted else nan),
    }
    for tag, st in (("", everyone), ("_completed", done)):
        out.update(_latency_keys(tag, st))
    out["client_jain"] = client_j
    out["client_jain_completed"] = client_jc
    out["horizon_s"] = horizon
    out["completed_within_horizon"] = int(np.count_nonzero(within))
    out = {k: out[k] for k in BASE_SUMMARY_KEYS}

    single = n_out == 1
    for name, ttft_slo, tpot_slo in profiles:
        # NaN ttft/tpot compare False, so requests without them never meet an SLO.
        met = int(np.count_nonzero(within & (ttft_all <= ttft_slo) & (single | (tpot_all <= tpot_slo))))
        out[f"slo_attainment_{name}"] = met / n if n else nan
        out[f"goodput_{name}_rps"] = met / horizon

    pre = counters.get("preemptions")
    if pre is None:
        pre = int(col("preemptions").sum())
    out["preemptions"] = pre
    out["iterations"] = counters.get("iterations")
    for key, value in counters.items():
        if key in COUNTER_KEYS:
            continue
        if key in out:
            raise ValueError(f"counter {key!r} collides with a metric of the same name")
        out[key] = value

    return {k: json_scalar(v) for k, v in out.items()}


def _censored(t_end: float, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, completed: np.ndarray,
              n_out: np.ndarray, ttft_all: np.ndarray, tpot_all: np.ndarray, e2e_all: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT (multi-token requests only) and E2E of every offered request, censored at the end
    of observation: `t_end` (the horizon's end), or the last first token or finish if later."""
    for times in (finish, first):
        seen = times[np.isfinite(times)]
        if seen.size:
            t_end = max(t_end, float(seen.max()))
    has_first = np.isfinite(first)
    ttft_c = np.where(has_first, ttft_all, np.maximum(t_end - arrival, 0.0))
    e2e_c = np.where(completed, e2e_all, np.maximum(t_end - arrival, 0.0))
    stall_from = np.where(has_first, first, arrival)
    tpot_c = np.where(completed, tpot_all,
                      np.maximum(t_end - stall_from, 0.0) / np.maximum(n_out - 1, 1))[n_out > 1]
    return ttft_c, tpot_c, e2e_c


def _throughput(finish: np.ndarray, completed: np.ndarray, n_out: np.ndarray, t0: float,
                n_completed: int) -> tuple[float, float, float]:
    """(makespan, completed requests per second, output tokens per second) over the completions."""
    if not n_completed:
        return 0.0, 0.0, 0.0
    makespan = float((finish[completed] - t0).max())
    tokens_c = float(n_out[completed].sum())
    if makespan > 0:
        return makespan, n_completed / makespan, tokens_c / makespan
    return makespan, math.nan, math.nan


def _latency_keys(tag: str, st: dict) -> dict:
    """The summary keys of one `_latency_stats` result (`tag` "" for every request,
    "_completed" for completed ones)."""
    return {
        f"ttft_mean{tag}_s": st["ttft_mean"],
        f"ttft_p50{tag}_s": st["ttft_p"][0],
        f"ttft_p90{tag}_s": st["ttft_p"][1],
        f"ttft_p99{tag}_s": st["ttft_p"][2],
        f"tpot_mean{tag}_s": st["tpot_mean"],
        f"tpot_p50{tag}_s": st["tpot_p"][0],
        f"tpot_p99{tag}_s": st["tpot_p"][1],
        f"e2e_mean{tag}_s": st["e2e_mean"],
        f"e2e_p99{tag}_s": st["e2e_p99"],
        f"norm_latency_mean{tag}_s": st["norm_lat"],
        f"slowdown_mean{tag}": st["slow_mean"],
        f"slowdown_jain{tag}": st["slow_jain"],
    }


def _latency_stats(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray, n_out: np.ndarray,
                   alone: np.ndarray) -> dict:
    """Means, percentiles, normalized latency and slowdowns of one population of requests.

    `ttft`, `e2e`, `n_out`, `alone` are per request of the population; `tpot` holds its
    requests with more than one output token. Empty populations give NaN.
    """
    nan = math.nan
    st = {"ttft_p": (nan, nan, nan), "ttft_mean": nan, "e2e_mean": nan, "e2e_p99": nan, "norm_lat": nan,
          "slow_mean": nan, "slow_jain": nan, "slow": np.empty(0), "tpot_mean": nan, "tpot_p": (nan, nan)}
    if e2e.size:
        st["ttft_p"] = percentiles(ttft, (50.0, 90.0, 99.0))
        (st["e2e_p99"],) = percentiles(e2e, (99.0,))
        st["ttft_mean"], st["e2e_mean"] = float(ttft.mean()), float(e2e.mean())
        st["norm_lat"] = float((e2e / n_out).mean())
        slow = e2e / alone
        st["slow"] = slow
        st["slow_mean"] = float(slow.mean())
        st["slow_jain"] = jain_index(slow)
    if tpot.size:
        st["tpot_mean"] = float(tpot.mean())
        st["tpot_p"] = tuple(percentiles(tpot, (50.0, 99.0)))
    return st


def _client_codes(clients: np.ndarray) -> tuple[np.ndarray, int]:
    """Each request's client as a code 0..k-1 in order of first appearance (-1 where missing:
    None or NaN), and k. Ids that are equal as str are one client, as `table_of` writes them."""
    if len(clients) == 0:
        return np.zeros(0, dtype=np.intp), 0
    seen: dict[Any, int] = {}   # each distinct id (as a dict key: 1 and 1.0 are one), by first appearance
    raw = np.fromiter((seen.setdefault(c, len(seen)) for c in clients), dtype=np.intp, count=len(clients))
    first: dict[str, int] = {}
    remap = np.array([-1 if _missing(c) else first.setdefault(str(c), len(first)) for c in seen], dtype=np.intp)
    return remap[raw], len(first)


def _missing(c: Any) -> bool:
    """A client id that names no client, as pandas counts them: None, a NaN of any kind (NaN is not
    equal to itself), or pandas' NA (which cannot say whether it is)."""
    if c is None:
        return True
    try:
        return bool(c != c)
    except TypeError:
        return True


def _client_jain(clients: tuple[np.ndarray, int], completed: np.ndarray, slow: np.ndarray) -> float:
    """Jain's index over per-client mean slowdown (see module docstring); NaN if undefined.
    `clients` is `_client_codes`' result."""
    codes, k = clients
    if k < 2:
        return math.nan
    codes_c = codes[completed]
    keep = codes_c >= 0
    if not keep.any():
        return math.nan
    counts = np.bincount(codes_c[keep], minlength=k)
    sums = np.bincount(codes_c[keep], weights=slow[keep], minlength=k)
    served = counts > 0
    if np.count_nonzero(served) < 2:
        return math.nan
    return jain_index(sums[served] / counts[served])
