"""Latency-anchored regions: parsing, the SLO-capacity bisection, the sweep under --region-def, and the
analysis recording the definition and comparing two headlines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _synthstore import MANIFEST, make_runs, write_store
from schedport.analysis.comparison import load_comparison
from schedport.analysis.portability import compute_portability
from schedport.api import analyze
from schedport.engine.runner import simulate
from schedport.engine.core.config import EngineConfig, engine_config_from_dict
from schedport.errors import SchedportError
from schedport.study.regions import DRAIN, SUSTAINABLE, CapacityCache, offered_rate, parse_region_def, slo_capacity
from schedport.study.store import read_results
from schedport.study.sweep import load_corpus, run_sweep, write_demo_corpus


def test_parse_region_def():
    assert parse_region_def(None).spec == parse_region_def("sustainable").spec == SUSTAINABLE
    assert parse_region_def("drain").spec == DRAIN
    assert parse_region_def("throughput").spec == DRAIN     # what stores made before recorded
    assert parse_region_def("slo").spec == "slo:standard:0.9"
    assert parse_region_def("slo:strict:0.8").spec == "slo:strict:0.8"
    assert parse_region_def("slo:relaxed").spec == "slo:relaxed:0.9"
    assert parse_region_def("slo").cache_hash("abc") == "abc|slo:standard:0.9"
    assert parse_region_def("drain").cache_hash("abc") == "abc"  # old caches stay valid
    assert parse_region_def(None).cache_hash("abc") == "abc|sustainable"
    for bad, msg in (("latency", "expected"), ("slo:standard:1.5", r"in \(0, 1\)"), ("slo:standard:x", "number"),
                     ("slo:nope", "not in the engine config"), ("slo:a:0.5:1", "expected")):
        with pytest.raises(SchedportError, match=msg) as ei:
            parse_region_def(bad, ["strict", "standard", "relaxed"])
        assert "\n" not in str(ei.value)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=60)


def test_slo_capacity_is_the_attainment_crossing(corpus):
    cfg = EngineConfig()
    c = load_corpus(corpus)
    trace = c.trace(c.windows[0].window_id)
    rate = slo_capacity(trace, cfg, "standard", 0.9)
    off = offered_rate(trace)

    def att(r):
        return simulate(trace, "vllm-fcfs", engine=cfg, time_scale=off / r).summary["slo_attainment_standard"]

    assert att(rate) >= 0.9
    assert att(rate * 1.01) < 0.9  # the bisection stops within 0.1% of the crossing
    # cached under its own key, beside the capacities
    cache = CapacityCache(corpus.parent / "cap.json")
    assert cache.capacity(trace, cfg, definition=parse_region_def("slo")) == rate
    assert cache.get(trace.content_sha256(), cfg.config_hash() + "|slo:standard:0.9") == rate
    assert cache.get(trace.content_sha256(), cfg.config_hash()) is None
    # a target the reference cannot meet even on an idle engine is refused in one line
    tight = engine_config_from_dict({"slo": {"standard": {"ttft_s": 1e-4, "tpot_s": 1e-4}}})
    with pytest.raises(SchedportError, match="meets only") as ei:
        slo_capacity(trace, tight, "standard", 0.9)
    assert "\n" not in str(ei.value)


def test_sweep_under_latency_regions(corpus, tmp_path):
    out = tmp_path / "res"
    res = run_sweep(corpus, out, schedulers="vllm-fcfs,sjf", regions="moderate,overload", workers=1,
                    progress=False, region_def="slo:standard:0.9")
    assert res.status == "finished"
    man = json.loads((out / "manifest.json").read_text())
    assert man["runs"][-1]["selectors"]["region_def"] == "slo:standard:0.9"
    df = read_results(out)
    c = load_corpus(corpus)
    cfg = EngineConfig()
    for wid, sub in df.groupby("window_id"):
        trace = c.trace(wid)
        anchor = slo_capacity(trace, cfg, "standard", 0.9)
        assert (sub["capacity_rps"] == anchor).all()
        for row in sub.itertuples():
            assert row.time_scale == pytest.approx(offered_rate(trace) / (anchor * row.rho), rel=1e-12)
    # a store run under one definition is not resumed under another
    with pytest.raises(SchedportError, match="region-def"):
        run_sweep(corpus, out, schedulers="vllm-fcfs,sjf", regions="moderate,overload", workers=1, progress=False)
    # the analysis records the definition
    pj = analyze(out, n_boot=20, n_splits=10).portability
    assert pj["parameters"]["region_def"] == "slo:standard:0.9"
    assert "latency-anchored" in pj["parameters"]["region_def_description"]


def test_headlines_compared_across_region_definitions(tmp_path):
    runs = make_runs(n_windows=5)
    a = write_store(tmp_path / "thr", runs)
    b = write_store(tmp_path / "slo", make_runs(n_windows=5, seed=1),
                    manifest={**MANIFEST, "selectors": {"region_def": "slo:standard:0.9"}})
    analyze(b, n_boot=50, n_splits=20)
    res = analyze(a, n_boot=50, n_splits=20, compare=b).portability
    rc = res["region_comparison"]
    # the synthetic store records no definition, as stores made before any other did: drain
    assert rc["this"]["region_def"] == "drain" and rc["other"]["region_def"] == "slo:standard:0.9"
    assert len(rc["this"]["reversals"]) == len(rc["other"]["reversals"]) == 5
    # the other store joins the protocol multiverse as the axis region_def
    rob = res["robustness"]
    assert rob["axes"]["region_def"] == ["drain", "slo:standard:0.9"] and rob["default_protocol"]["region_def"] == "drain"
    for c in rob["claims"]:
        assert "region_def" in c["axes"] and set(c["by_axis"]["region_def"]) == {"drain", "slo:standard:0.9"}
    assert rob["n_protocols"] == int(np.prod([len(v) for v in rob["axes"].values()]))
    html = (a / "report.html").read_text()
    assert "The headline under both region definitions" in html
    other = write_store(tmp_path / "other", runs, manifest={**MANIFEST, "engine_hash": "f" * 16})
    analyze(other, n_boot=20, n_splits=10)
    with pytest.raises(SchedportError, match="engine_hash"):
        load_comparison(other, compute_portability(runs, dict(MANIFEST), n_boot=20, n_splits=10))
    with pytest.raises(SchedportError, match="not found"):
        load_comparison(tmp_path / "absent", res)
