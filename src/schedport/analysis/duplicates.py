"""What the analysis counts once: metrics that are one ranking measured twice (metric families)
and schedulers whose results are identical (duplicates), and the scheduler pairs that are
therefore one comparison.

A family's repeats are dropped before any statistic (`metric_families`); duplicate schedulers
stay in every ranking (tied) but a test or comparison repeated through a duplicate counts once
(`duplicate_schedulers` gives each scheduler's class per condition, `pair_keys` the pair each
pair repeats, `pair_label` the joined name "edf = vllm-fcfs").
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from schedport.analysis.directions import MAIN_METRICS
from schedport.analysis.ranks import within_window_ranks
from schedport.analysis.store_loading import Study


def metric_families(st: Study, preferred: Sequence[str]) -> dict:
    """Groups of metrics whose within-window ranks agree in every window of every condition.

    Two metrics are the same ranking when, in every (source, region, window) of the complete
    blocks, one is defined exactly where the other is and both rank the schedulers identically
    (with at least one window where the ranks are not all tied): e.g. goodput = attainment x
    n_requests / horizon. Such a pair measures one thing twice, so only one member of each group
    is analysed: the first of `preferred` (the main metrics) in the group, else the first in
    column order. Returns {"groups": [[kept, dropped...], ...], "dropped": [...]}.
    """
    M = len(st.metrics)
    same = np.ones((M, M), dtype=bool)
    informative = np.zeros(M, dtype=bool)
    for s in st.sources:
        ranks, valid = within_window_ranks(st.values[s], st.direction, st.block[s])  # (R, M, W, K), (R, M, W)
        spread = (ranks.max(axis=-1) > ranks.min(axis=-1)) & valid
        informative |= spread.any(axis=(0, 2))
        for i in range(M):
            for j in range(i + 1, M):
                if not same[i, j]:
                    continue
                ok = np.array_equal(valid[:, i], valid[:, j]) and np.array_equal(
                    ranks[:, i][valid[:, i]], ranks[:, j][valid[:, j]])
                same[i, j] = same[j, i] = ok
    pref = {m: n for n, m in enumerate(preferred)}
    seen: set = set()
    groups, dropped = [], []
    for i in range(M):
        if i in seen or not informative[i]:
            continue
        members = [j for j in range(M) if j == i or (same[i, j] and informative[j])]
        if len(members) < 2:
            continue
        seen.update(members)
        names = sorted((st.metrics[j] for j in members), key=lambda m: (pref.get(m, len(pref)), st.metrics.index(m)))
        groups.append(names)
        dropped += names[1:]
    return {"groups": groups, "dropped": dropped}


def class_labels(x: np.ndarray) -> np.ndarray:
    """For each column k of x (..., K): the index of the first column bit-identical to it (NaN = NaN)."""
    K = x.shape[-1]
    cols = np.ascontiguousarray(np.asarray(x, dtype=np.float64).reshape(-1, K).T)
    nan = np.isnan(cols)
    cols = np.where(nan, 0.0, cols) + 0.0  # + 0.0 turns -0.0 into 0.0
    first: dict = {}
    out = np.empty(K, dtype=np.int64)
    for k in range(K):
        out[k] = first.setdefault(cols[k].tobytes() + nan[k].tobytes(), k)
    return out


def duplicate_schedulers(st: Study) -> dict:
    """Schedulers whose results are identical, per source and per (source, region) condition.

    Two schedulers are duplicates in a condition when every analysed metric is bit-identical
    (NaN equal to NaN) in every window of its complete block; in a source, when they are so in
    every condition of the source. Returns ``labels`` (S, R, K): per condition, the index of the
    first scheduler of each one's class, which the reversal counting uses so that a comparison
    repeated by a duplicate counts once; ``by_source`` {source: [[names...], ...]} (classes of 2+)
    and ``by_condition`` {source: {region: [[names...], ...]}} where a condition has classes the
    whole source does not.
    """
    S, R, K = len(st.sources), len(st.regions), len(st.schedulers)
    labels = np.tile(np.arange(K), (S, R, 1))
    by_source, by_condition = {}, {}

    def _groups(lab) -> list:
        out = []
        for k in range(K):
            members = [st.schedulers[j] for j in range(K) if lab[j] == k]
            if len(members) > 1:
                out.append(members)
        return out

    for si, s in enumerate(st.sources):
        vals = st.values[s]  # (R, M, W, K); NaN outside the block
        used = []
        for r in range(R):
            if not st.block[s][r].any():
                continue
            labels[si, r] = class_labels(vals[r][:, st.block[s][r]])
            used.append(r)
        if not used:
            continue
        src_lab = class_labels(np.concatenate([vals[r][:, st.block[s][r]].reshape(-1, K) for r in used]))
        g = _groups(src_lab)
        if g:
            by_source[s] = g
        whole = {frozenset(x) for x in g}
        cond = {}
        for r in used:
            gr = [x for x in _groups(labels[si, r]) if frozenset(x) not in whole]
            if gr:
                cond[st.regions[r]] = _groups(labels[si, r])
        if cond:
            by_condition[s] = cond
    return {"labels": labels, "by_source": by_source, "by_condition": by_condition}


def pair_keys(lab1: np.ndarray, lab2: Optional[np.ndarray], I: np.ndarray, J: np.ndarray, K: int,
              keep: Optional[np.ndarray] = None) -> np.ndarray:
    """For each scheduler pair: the index of the first pair it duplicates, or -1 for a pair of twins.

    `lab1` (and `lab2` for a comparison of two conditions) give each scheduler's class in a
    condition (`duplicate_schedulers`); schedulers identical in every condition involved share a
    joint class. Two pairs with the same joint classes are one comparison; a pair whose two
    schedulers share a joint class compares a scheduler with itself. With `keep` (a mask over
    the pairs) only the kept pairs take part: the others get -1 and are never a representative.
    """
    joint = lab1 if lab2 is None else lab1 * K + lab2
    a, b = joint[I], joint[J]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    first: dict = {}
    rep = np.empty(len(I), dtype=np.int64)
    for p_ in range(len(I)):
        if keep is not None and not keep[p_]:
            rep[p_] = -1
            continue
        rep[p_] = -1 if lo[p_] == hi[p_] else first.setdefault((int(lo[p_]), int(hi[p_])), p_)
    return rep


def pair_label(st: Study, k: int, lab1: np.ndarray, lab2: Optional[np.ndarray]) -> str:
    """A scheduler's name, joined with its duplicates in the conditions compared ("edf = vllm-fcfs")."""
    K = len(st.schedulers)
    joint = lab1 if lab2 is None else lab1 * K + lab2
    return " = ".join(st.schedulers[j] for j in range(K) if joint[j] == joint[k])


def find_duplicates(st: Study, notes: list[str]) -> tuple[dict, dict]:
    """The duplicates step: drop each metric family's repeats from `st`, then find the duplicate
    schedulers; both are said in `notes`. Returns (`metric_families`, `duplicate_schedulers`)."""
    families = metric_families(st, MAIN_METRICS)
    for g in families["groups"]:
        notes.append(f"Metrics {' = '.join(g)} rank the schedulers identically in every window: one ranking "
                     f"measured {len(g)} times, so only {g[0]} is analysed.")
    if families["dropped"]:
        st.drop_metrics(families["dropped"])
    dups = duplicate_schedulers(st)
    for s_, groups in dups["by_source"].items():
        notes.append(f"{s_}: " + "; ".join(" = ".join(g) for g in groups) + " give identical results in every "
                     "window and region (counted once in reversals).")
    return families, dups
