"""Sustainable capacity: rho > 1 is a growing queue in every request mix, unlike the drain definition."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from schedport.analysis.regimes import REGIME_SPREAD, regime_check
from schedport.engine.runner import capacity, simulate
from schedport.engine.core.config import engine_config_from_dict
from schedport.errors import SchedportError
from schedport.study.regions import CapacityCache, parse_region_def
from schedport.workload.trace import Trace

# Few slots, many requests: the batch admitted at once (16 of 800) is too small a share of the
# window to move the backlog, so what is measured is the capacity alone.
CFG = engine_config_from_dict({"engine": {"max_num_seqs": 16}})
N = 800


def _windows():
    """Two windows with the same Poisson arrivals and prompts: constant outputs, and lognormal
    outputs (sigma 1.3) with the same mean."""
    rng = np.random.default_rng(3)
    arr = np.round(np.cumsum(rng.exponential(1.0, N)), 6)
    arr -= arr[0]
    inp = rng.integers(50, 300, N)
    heavy = np.clip(np.round(rng.lognormal(np.log(200) - 1.3 ** 2 / 2, 1.3, N)), 1, 4000).astype(int)
    return Trace(arr, inp, np.full(N, 200), None, "constant"), Trace(arr, inp, heavy, None, "heavy")


def _backlog(trace, definition, rho):
    scale = (len(trace) - 1) / trace.span_s / (capacity(trace, CFG, definition) * rho)
    return simulate(trace, "vllm-fcfs", engine=CFG, time_scale=scale).summary["backlog_at_last_arrival"]


@pytest.mark.parametrize("rho", [1.2, 1.6])
def test_both_mixes_reach_the_fluid_backlog_under_the_sustainable_capacity(rho):
    fluid = 1 - 1 / rho
    constant, heavy = _windows()
    for t in (constant, heavy):
        assert abs(_backlog(t, "sustainable", rho) - fluid) < 0.08, t.name
    # the drain definition: the heavy-tailed mix's long drain lowers its capacity, so its
    # "overload" hardly queues
    assert abs(_backlog(constant, "drain", rho) - fluid) < 0.08
    assert fluid - _backlog(heavy, "drain", rho) > 0.15


def test_below_capacity_the_queue_stays_short():
    for t in _windows():
        assert _backlog(t, "sustainable", 0.6) < 0.02


def test_a_short_window_is_measured_on_copies_of_its_mix():
    """A window shorter than 4 batches is replayed as copies of its mix: a window of 16 requests
    (4 copies, 64 requests) and the same mix twice over (2 copies) measure the same replay."""
    rng = np.random.default_rng(1)
    t = Trace(np.arange(16.0), rng.integers(20, 200, 16), rng.integers(20, 300, 16), None, "short")
    twice = Trace(np.arange(32.0), np.tile(t.input_tokens, 2), np.tile(t.output_tokens, 2), None, "twice")
    assert capacity(t, CFG) == capacity(twice, CFG)
    assert capacity(t, CFG) != capacity(t, CFG, "drain")
    with pytest.raises(SchedportError, match="capacity definition"):
        capacity(t, CFG, "peak")


def test_capacity_is_cached_per_definition(tmp_path):
    t, _ = _windows()
    cache = CapacityCache(tmp_path / "cap.json")
    h = CFG.config_hash()
    sus = cache.capacity(t, CFG, definition=parse_region_def(None))
    drain = cache.capacity(t, CFG, definition=parse_region_def("drain"))
    cache.save()
    back = CapacityCache(tmp_path / "cap.json")
    assert back.get(t.content_sha256(), h + "|sustainable") == sus == capacity(t, CFG)
    assert back.get(t.content_sha256(), h) == drain == capacity(t, CFG, "drain")   # the old key


def _runs(backlogs: dict) -> pd.DataFrame:
    rows = []
    for (source, region, rho), values in backlogs.items():
        for w, b in enumerate(values):
            for sched, shift in (("vllm-fcfs", 0.0), ("sjf", -0.05)):
                rows.append({"source": source, "window_id": f"{source}-{w}", "region": region, "scheduler": sched,
                             "seed": 0, "rho": rho, "backlog_at_last_arrival": b + shift,
                             "ttft_p50_s": 1.0 + b, "slo_attainment_standard": 1.0 - b})
    return pd.DataFrame(rows)


def test_regime_check_flags_a_region_whose_sources_queue_differently():
    df = _runs({("a", "light", 0.5): [0.0, 0.01, 0.02], ("b", "light", 0.5): [0.0, 0.0, 0.03],
                ("a", "overload", 1.6): [0.30, 0.35, 0.40], ("b", "overload", 1.6): [0.10, 0.15, 0.2]})
    rg = regime_check(df, ["light", "overload"], ["a", "b"])
    assert rg["available"] and rg["scheduler"] == "vllm-fcfs"
    row = {(r["source"], r["region"]): r for r in rg["rows"]}
    assert row[("a", "overload")]["backlog_median"] == pytest.approx(0.35)     # the reference's, not sjf's
    assert row[("a", "overload")]["fluid_backlog"] == pytest.approx(0.375)
    assert row[("b", "light")]["fluid_backlog"] == 0.0
    assert row[("a", "overload")]["ttft_p50_s_median"] == pytest.approx(1.35)
    assert [f["region"] for f in rg["flagged"]] == ["overload"]
    assert rg["flagged"][0]["spread"] == pytest.approx(0.2) and REGIME_SPREAD == 0.1
    # a store made before the column existed, or without the reference: no check, and why
    assert "no backlog_at_last_arrival" in regime_check(df.drop(columns="backlog_at_last_arrival"), ["light"],
                                                         ["a"])["note"]
    assert "not in the store" in regime_check(df[df.scheduler == "sjf"], ["light"], ["a"])["note"]


def test_the_report_flags_a_region_that_is_not_one_regime(tmp_path):
    from _synthstore import REGIONS6, SCHEDULERS13, make_runs, write_store
    from schedport.api import analyze

    runs = make_runs(n_windows=5, regions=REGIONS6[4:], schedulers=SCHEDULERS13[9:12])
    # vllm-fcfs queues a third of azure's windows at severe and a tenth of the others'
    runs["backlog_at_last_arrival"] = np.where(runs["region"] == "severe",
                                               np.where(runs["source"] == "azure", 0.33, 0.10), 0.15)
    store = write_store(tmp_path / "res", runs)
    res = analyze(store, n_boot=20, n_splits=10).portability
    assert [f["region"] for f in res["regimes"]["flagged"]] == ["severe"]
    html = (store / "report.html").read_text()
    first_screen = html[:html.index("<h2")]
    assert "id='regime-warning'" in first_screen and "severe (backlog 0.10&ndash;0.33)" in first_screen
    assert 'id="regimes" class="fold" open' in html and html.count("<tr class='flag'>") == 3


def test_simulate_load_follows_the_region_definition_as_a_sweep_cell_does():
    from schedport.study.regions import time_scale

    t, _ = _windows()
    for spec in (None, "drain", "slo"):
        anchor = parse_region_def(spec).anchor(t, CFG)
        assert simulate(t, "vllm-fcfs", engine=CFG, load=1.2, region_def=spec).scale == time_scale(t, anchor, 1.2)
    with pytest.raises(SchedportError, match="expected 'sustainable'"):
        simulate(t, "vllm-fcfs", engine=CFG, load=1.2, region_def="peak")
