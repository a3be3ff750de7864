"""The regime check: is a region the same load regime in every source?

Reads the reference scheduler's queue at the window's last arrival per (source, region) and
flags a region whose sources' median backlogs differ by more than `REGIME_SPREAD`: there a
cross-source comparison "at this load" compares different regimes. See the method in
`schedport.analysis.portability` ("Regime check").
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

#: The regime check: the reference scheduler whose queue it reads, the metrics it reports beside
#: the backlog, and the spread of backlog between sources above which a region is flagged.
REGIME_SCHEDULER = "vllm-fcfs"
REGIME_METRICS = ("ttft_p50_s", "slo_attainment_standard")
REGIME_SPREAD = 0.1


def regime_check(df: pd.DataFrame, regions: Sequence[str], sources: Sequence[str]) -> dict:
    """Is a region the same regime in every source? The reference scheduler's queue, per source and region.

    For each (source, region): the median over windows (seeds averaged first) of
    `REGIME_SCHEDULER`'s ``backlog_at_last_arrival`` (the share of accepted requests still
    queued when the last one arrives), beside the fluid value max(0, 1 - 1/rho) of a queue
    started empty at offered load rho, the median ``ttft_p50_s`` and the median standard-SLO
    attainment. A region whose sources' median backlogs differ by more than `REGIME_SPREAD` is
    flagged: there "at this load" compares different regimes across sources. The check reads
    only the store; a store without the reference scheduler or the backlog column (made before
    it was recorded) gives an empty table and says why.
    """
    out = {"scheduler": REGIME_SCHEDULER, "spread_limit": REGIME_SPREAD, "rows": [], "flagged": [],
           "available": False, "note": ""}
    if "backlog_at_last_arrival" not in df.columns:
        out["note"] = "the store has no backlog_at_last_arrival column (made before it was recorded): no regime check"
        return out
    ref = df[df["scheduler"].astype(str) == REGIME_SCHEDULER]
    if ref.empty:
        out["note"] = f"{REGIME_SCHEDULER} is not in the store: no regime check"
        return out
    cols = ["backlog_at_last_arrival", "rho"] + [m for m in REGIME_METRICS if m in ref.columns]
    per_window = (ref.assign(source=ref["source"].astype(str), region=ref["region"].astype(str))
                  .groupby(["source", "region", "window_id"], observed=True)[cols]
                  .mean(numeric_only=True).reset_index())
    for region in regions:
        spread_of = []
        for source in sources:
            g = per_window[(per_window["source"] == source) & (per_window["region"] == region)]
            if g.empty:
                continue
            rho = float(g["rho"].iloc[0])
            med = {c: (float(np.nanmedian(g[c])) if g[c].notna().any() else None) for c in cols if c != "rho"}
            row = {"source": source, "region": region, "rho": rho, "n_windows": int(len(g)),
                   "backlog_median": med["backlog_at_last_arrival"], "fluid_backlog": max(0.0, 1.0 - 1.0 / rho)}
            row.update({f"{m}_median": med.get(m) for m in REGIME_METRICS})
            row["vs_fluid"] = None if row["backlog_median"] is None else row["backlog_median"] - row["fluid_backlog"]
            out["rows"].append(row)
            if row["backlog_median"] is not None:
                spread_of.append(row["backlog_median"])
        if len(spread_of) > 1 and max(spread_of) - min(spread_of) > REGIME_SPREAD:
            out["flagged"].append({"region": region, "spread": max(spread_of) - min(spread_of),
                                   "low": min(spread_of), "high": max(spread_of)})
    out["available"] = bool(out["rows"])
    return out
