"""`schedport explain`: hybrid windows, the paired effect, attribution, verdict, CLI and report section.

The two planted-cause tests build synthetic corpora whose sources differ in exactly one feature
(burstiness of arrivals; output lengths), run a scheduler pair whose order depends on that feature
through the real sweep and engine, and check that the attribution names it and gives about none of
the gap to the others. Because the shares of different features are far apart, computing a share
from another feature's variant fails them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from schedport.errors import SchedportError
from schedport.analysis.explain import (FEATURES, Variant, attribute, build_variant, decouple_lengths, explain,
                                        paired_effects, poisson_arrivals, ranked_reversals, resample_marginal,
                                        transplant_arrivals, verdict)
from schedport.report.explain import render_section
from schedport.common.atomic import atomic_write_bytes
from schedport.workload.trace import Trace, save_trace

CONTRACT_EFFECT = {"variant", "feature", "donor", "median_effect", "ci_low", "ci_high", "n_windows"}


# --------------------------------------------------------------------------- synthetic corpora


def _window(rng, n, *, bursty: bool, outputs: str):
    ins = np.clip(rng.lognormal(6.0, 0.8, n), 16, 3000).astype(int)
    if outputs == "medium":
        outs = np.clip(rng.lognormal(4.0, 0.6, n), 4, 1500).astype(int)
    elif outputs == "long":
        outs = np.clip(rng.lognormal(5.8, 0.9, n), 4, 1500).astype(int)
    elif outputs == "constant":
        outs = np.full(n, 128)
    elif outputs == "heavy":
        outs = np.clip(rng.pareto(1.3, n) * 40 + 8, 8, 1500).astype(int)
    elif outputs == "tied":
        outs = rng.choice([32, 128, 512], n)
    else:
        outs = np.clip(rng.lognormal(2.3, 0.5, n), 2, 1500).astype(int)
    gaps = rng.gamma(0.08, 1 / 0.08, n - 1) if bursty else rng.exponential(1.0, n - 1)
    return np.round(np.concatenate([[0.0], np.cumsum(gaps)]), 6), ins, outs


def write_corpus(out: Path, sources, *, windows: int, n: int) -> Path:
    """A corpus whose sources differ only in the generator settings given (same layout as the real one)."""
    (out / "windows").mkdir(parents=True, exist_ok=True)
    entries = []
    for si, (src, bursty, outputs) in enumerate(sources):
        for k in range(windows):
            arr, ins, outs = _window(np.random.default_rng([si, k, 7]), n, bursty=bursty, outputs=outputs)
            wid = f"{src}-{k:02d}"
            t = Trace.from_arrays(arr, ins, outs, name=wid)
            save_trace(t, out / "windows" / f"{wid}.parquet")
            entries.append({"window_id": wid, "source": src, "n_requests": n, "duration_s": float(t.span_s),
                            "sha256": t.content_sha256()})
    digest = hashlib.sha256("".join(e["window_id"] + ":" + e["sha256"] + "\n" for e in entries).encode())
    atomic_write_bytes(out / "manifest.json", json.dumps({"schema": 1, "corpus_sha256": digest.hexdigest(),
                                                          "code_version": "test", "windows": entries}).encode())
    return out


def _study(tmp: Path, sources, pair: str, rho: float, windows: int, n: int) -> Path:
    from schedport.study.sweep import run_sweep

    corpus = write_corpus(tmp / "corpus", sources, windows=windows, n=n)
    run_sweep(corpus, tmp / "res", schedulers=pair, regions=f"r={rho}", workers=1, progress=False)
    return tmp / "res"


def _explained(tmp_path_factory, name, sources, pair, metric, windows, n, rho=0.95):
    """A two-source study of `pair` at `rho` and its explanation on `metric`."""
    res = _study(tmp_path_factory.mktemp(name), sources, pair, rho, windows, n)
    d = explain(res, pair=pair, metric=metric, region="r", sources=",".join(s[0] for s in sources),
                workers=1, progress=False)
    return res, d


@pytest.fixture(scope="module")
def burst(tmp_path_factory):
    """Sources identical but for burstiness; fastserve vs spf on p90 TTFT flips with it."""
    return _explained(tmp_path_factory, "burst", [("bursty", True, "medium"), ("smooth", False, "medium")],
                      "fastserve,spf", "ttft_p90_s", 10, 200)


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    """Sources identical but for output lengths; static vs fastserve on SLO attainment flips with them."""
    return _explained(tmp_path_factory, "lengths", [("short", False, "short"), ("long", False, "long")],
                      "static,fastserve", "slo_attainment_standard", 8, 150)


@pytest.fixture(scope="module")
def tied_lengths(tmp_path_factory):
    """Sources identical but for output lengths, one of them constant (every output tied); on it sjf
    is FCFS, on the heavy-tailed one the two differ (at overload, where queues form): the whole gap
    is the output lengths'."""
    return _explained(tmp_path_factory, "tied", [("constant", False, "constant"), ("heavy", False, "heavy")],
                      "sjf,vllm-fcfs", "ttft_p50_s", 8, 150, rho=1.6)


@pytest.fixture(scope="module")
def tied_burst(tmp_path_factory):
    """Sources identical but for burstiness, with outputs from three repeated values (ties everywhere)."""
    return _explained(tmp_path_factory, "tiedburst", [("bursty", True, "tied"), ("smooth", False, "tied")],
                      "sjf,vllm-fcfs", "ttft_p50_s", 10, 200, rho=0.8)


# --------------------------------------------------------------------------- planted causes


def test_planted_output_lengths_with_ties_are_attributed_to_output_lengths(tied_lengths):
    """Ranking tied lengths by position would lay the heavy source's quantiles out in arrival order on
    the constant window -- lengths growing with time, on which sjf is FCFS -- so the forward transplant
    would close none of the gap and the share would come out 50% [50%, 50%]. Ties ranked at random, the
    transplant carries the heavy source's lengths, and nearly the whole gap is theirs."""
    _, d = tied_lengths
    e = {(x["base"], x["feature"]): x["median_effect"] for x in d["effects"]}
    assert e[("constant", None)] == 0.0 and e[("heavy", None)] != 0.0      # sjf is FCFS on constant outputs
    att = d["attribution"]
    assert att["output"]["share"] >= 0.8 and att["output"]["ci_low"] > 0, att["output"]
    for f in ("arrival", "input"):
        assert abs(att[f]["share"]) < 0.3, (f, att[f])
    assert d["verdict"]["drivers"] == ["output"]


def test_planted_burstiness_with_tied_lengths_is_attributed_to_the_arrival_process(tied_burst):
    _, d = tied_burst
    att = d["attribution"]
    assert att["arrival"]["share"] >= 0.8 and att["arrival"]["ci_low"] > 0, att["arrival"]
    for f in ("input", "output"):
        assert abs(att[f]["share"]) < 0.3, (f, att[f])


def test_tied_lengths_are_ranked_at_random_by_the_recipe():
    v = np.array([5, 1, 5, 5, 2, 5, 5, 5])
    donor = np.arange(100, 180, 10)
    a = resample_marginal(v, donor, np.random.default_rng(1))
    assert a[1] == 100 and a[4] == 110                      # distinct values keep their ranks
    assert sorted(a[v == 5].tolist()) == [120, 130, 140, 150, 160, 170]
    assert a[v == 5].tolist() != sorted(a[v == 5].tolist())   # not laid out in position order
    assert np.array_equal(a, resample_marginal(v, donor, np.random.default_rng(1)))
    by_position = resample_marginal(v, donor)
    assert by_position[v == 5].tolist() == [120, 130, 140, 150, 160, 170]
    base = Trace.from_arrays(np.arange(6.0), np.full(6, 10), np.full(6, 7), name="b")
    don = Trace.from_arrays(np.arange(6.0), np.full(6, 10), np.array([1, 2, 3, 4, 5, 600]), name="d")
    var = Variant("output", "b", base.content_sha256(), "d", don.content_sha256(), 0)
    t1, t2 = build_variant(var, base, don), build_variant(var, base, don)
    assert np.array_equal(t1.output_tokens, t2.output_tokens)              # seeded by the recipe
    assert sorted(t1.output_tokens.tolist()) == [1, 2, 3, 4, 5, 600]
    assert t1.output_tokens.tolist() != [1, 2, 3, 4, 5, 600]                # no trend in time


def test_planted_burstiness_is_attributed_to_the_arrival_process(burst):
    _, d = burst
    assert d["schema"] == "schedport.explain/1"    # a file schema: not the module's path, which moved
    att = d["attribution"]
    r = d["reversal"]
    assert r["condition_a"]["median_effect"] < 0 < r["condition_b"]["median_effect"]  # a real flip
    assert d["verdict"]["flip_reproduced"] is True
    assert 0.7 <= att["arrival"]["share"] <= 1.3 and att["arrival"]["ci_low"] > 0.3
    assert 0.7 <= att["burstiness"]["share"] <= 1.3 and att["burstiness"]["ci_low"] > 0.3
    for f in ("input", "output"):
        assert abs(att[f]["share"]) <= 0.2, (f, att[f])
    assert "arrival" in d["verdict"]["drivers"] and "burstiness" in d["verdict"]["drivers"]
    assert not {"input", "output", "coupling"} & set(d["verdict"]["drivers"])
    assert d["verdict"]["kind"] == "single feature"
    assert "arrival process" in d["verdict"]["sentence"]
    # the transplant carries the flip: X with Y's arrivals ranks the pair as Y does, and back
    e = {(x["base"], x["feature"]): x["median_effect"] for x in d["effects"]}
    assert abs(e[("bursty", "arrival")] - e[("smooth", None)]) < abs(e[("bursty", None)] - e[("smooth", None)]) / 3
    assert abs(e[("smooth", "arrival")] - e[("bursty", None)]) < abs(e[("bursty", None)] - e[("smooth", None)]) / 3


def test_planted_output_lengths_are_attributed_to_output_lengths(lengths):
    _, d = lengths
    att = d["attribution"]
    r = d["reversal"]
    assert r["condition_a"]["median_effect"] > 0 > r["condition_b"]["median_effect"]  # a real flip
    assert 0.8 <= att["output"]["share"] <= 1.2 and att["output"]["ci_low"] > 0.5
    for f in ("arrival", "burstiness", "input", "coupling"):
        assert abs(att[f]["share"]) <= 0.2, (f, att[f])
    assert d["verdict"]["drivers"] == ["output"] and d["verdict"]["flip_reproduced"] is True
    assert "output lengths" in d["verdict"]["sentence"]


def test_shares_follow_from_the_effects_of_their_own_variants(burst, lengths):
    for _, d in (burst, lengths):
        e = {(x["base"], x["feature"]): x["median_effect"] for x in d["effects"]}
        x, y = d["reversal"]["condition_a"]["source"], d["reversal"]["condition_b"]["source"]
        gap = e[(y, None)] - e[(x, None)]
        for f, a in d["attribution"].items():
            fwd, mir = (e[(x, f)] - e[(x, None)]) / gap, (e[(y, None)] - e[(y, f)]) / gap
            want = (fwd + mir) / 2 if FEATURES[f][0] == "transplant" else fwd + mir
            assert a["share"] == pytest.approx(want, abs=1e-12), f


# --------------------------------------------------------------------------- the contract and the analysis


def test_json_contract(burst):
    _, d = burst
    r = d["reversal"]
    assert {"scheduler_a", "scheduler_b", "metric", "condition_a", "condition_b"} <= set(r)
    assert r["condition_a"]["source"] == "bursty" and r["condition_b"]["region"] == "r"
    assert len(d["effects"]) == 2 * (1 + 5)  # originals + arrival, burstiness, input, output, coupling per side
    for e in d["effects"]:
        assert CONTRACT_EFFECT <= set(e)
        assert e["n_windows"] == 10
        assert e["ci_low"] <= e["median_effect"] <= e["ci_high"]
    donors = {(e["base"], e["feature"]): e["donor"] for e in d["effects"]}
    assert donors[("bursty", "arrival")] == "smooth" and donors[("smooth", "output")] == "bursty"
    assert donors[("bursty", "burstiness")] is None and donors[("bursty", None)] is None
    for a in d["attribution"].values():
        assert {"share", "ci_low", "ci_high"} <= set(a)
    assert {"kind", "drivers", "sentence"} <= set(d["verdict"])
    # every variant window is recorded as a recipe with its hash
    rec = d["variants"][0]
    assert {"variant", "window_id", "donor_window", "recipe_sha256", "content_sha256"} <= set(rec)
    json.dumps(d, allow_nan=False)


def test_original_effects_are_the_analysis_effects_of_the_store(burst):
    """The original conditions' medians equal the analysis's formula on the store's own rows."""
    from schedport.analysis.portability import load_store, relative_effect

    res, d = burst
    df, _ = load_store(res)
    for cond in ("condition_a", "condition_b"):
        s = d["reversal"][cond]["source"]
        sub = df[(df["source"] == s)].pivot_table(index="window_id", columns="scheduler", values="ttft_p90_s")
        e = relative_effect(sub["fastserve"].to_numpy(), sub["spf"].to_numpy(), -1)
        assert d["reversal"][cond]["median_effect"] == float(np.median(e))


def test_rerun_uses_the_cache_and_gives_identical_results(burst):
    res, d = burst
    again = explain(res, pair="fastserve,spf", metric="ttft_p90_s", region="r", sources="bursty,smooth",
                    workers=1, progress=False)
    assert again["run_info"]["runs"] == 0 and again["run_info"]["capacities"] == 0
    assert again["run_info"]["cached_runs"] == d["run_info"]["runs"]
    strip = lambda x: {k: v for k, v in x.items() if k != "run_info"}  # noqa: E731
    assert json.dumps(strip(again)) == json.dumps(strip(d))


def test_pool_executor_gives_the_same_attribution(burst, tmp_path):
    res, d = burst
    two = explain(res, pair="fastserve,spf", metric="ttft_p90_s", region="r", sources="bursty,smooth",
                  workers=2, progress=False, cache_dir=tmp_path / "cache", features=["arrival"])
    assert two["run_info"]["runs"] > 0
    assert two["attribution"]["arrival"] == d["attribution"]["arrival"]


# --------------------------------------------------------------------------- variants


def _trace(n=50, seed=0, clients=False):
    rng = np.random.default_rng(seed)
    arr = np.round(np.cumsum(rng.exponential(1.0, n)), 6)
    cl = [f"c{i % 3}" for i in range(n)] if clients else None
    return Trace.from_arrays(arr, rng.integers(1, 500, n), rng.integers(1, 300, n), cl, name=f"t{seed}")


def test_arrival_transplant_keeps_the_rate_and_takes_the_pattern():
    base, donor = _trace(60, 1), _trace(40, 2)
    arr = transplant_arrivals(base, donor)
    assert arr[0] == base.arrival_s[0] and arr[-1] == pytest.approx(base.arrival_s[-1], abs=1e-9)
    g, dg = np.diff(arr), np.diff(donor.arrival_s)
    tiled = np.resize(dg, len(g))
    np.testing.assert_allclose(g / g.sum(), tiled / tiled.sum(), rtol=1e-9, atol=1e-12)
    with pytest.raises(SchedportError, match="no inter-arrival pattern"):
        transplant_arrivals(base, Trace.from_arrays([5.0, 5.0], [1, 1], [1, 1], name="flat"))


def test_rank_preserving_resampling_keeps_order_and_takes_the_donor_marginal():
    rng = np.random.default_rng(3)
    x = rng.integers(1, 100, 500)
    donor = rng.lognormal(7, 1, 2000).astype(int)
    y = resample_marginal(x, donor)
    order = np.argsort(x, kind="stable")
    assert (np.diff(y[order]) >= 0).all()  # same order as x (ties in position order)
    np.testing.assert_allclose(np.quantile(y, [0.1, 0.5, 0.9]), np.quantile(donor, [0.1, 0.5, 0.9]), rtol=0.05)
    assert set(y) <= set(donor)


def test_controls_are_deterministic_and_keep_marginals_and_rate():
    base = _trace(80, 4)
    v = Variant("coupling", base.name, base.content_sha256(), seed=0)
    ins, outs = decouple_lengths(base, v.rng())
    assert sorted(ins) == sorted(base.input_tokens) and sorted(outs) == sorted(base.output_tokens)
    a = build_variant(v, base)
    assert a.content_sha256() == build_variant(v, base).content_sha256()
    assert build_variant(Variant("coupling", base.name, base.content_sha256(), seed=1), base).content_sha256() \
        != a.content_sha256()
    p = build_variant(Variant("burstiness", base.name, base.content_sha256()), base)
    assert p.span_s == pytest.approx(base.span_s) and len(p) == len(base)
    np.testing.assert_array_equal(p.input_tokens, base.input_tokens)
    arr = poisson_arrivals(base, np.random.default_rng(0))
    assert (np.diff(arr) >= 0).all()


def test_client_variants_and_recipe_hash():
    base, donor = _trace(30, 5, clients=True), _trace(10, 6, clients=True)
    none = build_variant(Variant("clients_removed", base.name, base.content_sha256()), base)
    assert none.client_id is None
    took = build_variant(Variant("clients", base.name, base.content_sha256(), donor.name, donor.content_sha256()),
                         base, donor)
    assert list(took.client_id) == list(np.resize(np.asarray(donor.client_id, dtype=object), 30))
    v = Variant("arrival", "a", "x" * 64, "b", "y" * 64, 0)
    assert v.recipe_sha256() == Variant("arrival", "a", "x" * 64, "b", "y" * 64, 0).recipe_sha256()
    assert v.recipe_sha256() != Variant("input", "a", "x" * 64, "b", "y" * 64, 0).recipe_sha256()
    with pytest.raises(SchedportError, match="needs a donor"):
        build_variant(Variant("input", base.name, base.content_sha256()), base)
    with pytest.raises(SchedportError, match="unknown variant feature"):
        build_variant(Variant("colour", base.name, base.content_sha256()), base)


# --------------------------------------------------------------------------- effects, attribution, verdict


def test_paired_effect_is_the_analysis_formula():
    a, b = np.array([1.0, 2.0, np.nan]), np.array([2.0, 2.0, 1.0])
    np.testing.assert_allclose(paired_effects(a, b, "ttft_p99_s"), [2 / 3, 0.0, np.nan])  # lower is better
    np.testing.assert_allclose(paired_effects(np.array([0.9]), np.array([0.5]), "slo_attainment_standard"), [0.4])
    with pytest.raises(SchedportError, match="no known direction"):
        paired_effects(a, b, "iterations")


def test_attribution_formulas_and_intervals():
    B = 200
    rng = np.random.default_rng(0)
    noise = lambda: rng.normal(0, 0.01, B)  # noqa: E731
    eff = {("x", "original"): (0.2, 0.2 + noise()), ("y", "original"): (-0.2, -0.2 + noise()),
           ("x", "arrival"): (-0.2, -0.2 + noise()), ("y", "arrival"): (0.2, 0.2 + noise()),
           ("x", "input"): (0.2, 0.2 + noise()), ("y", "input"): (-0.2, -0.2 + noise()),
           ("x", "burstiness"): (0.0, noise()), ("y", "burstiness"): (0.0, noise())}
    att = attribute(eff, ["arrival", "input", "burstiness"])
    assert att["arrival"]["share"] == pytest.approx(1.0) and att["input"]["share"] == pytest.approx(0.0)
    assert att["burstiness"]["share"] == pytest.approx(1.0)  # both lose it: the gap disappears
    assert att["arrival"]["ci_low"] < 1.0 < att["arrival"]["ci_high"]
    rev = {"scheduler_a": "a", "scheduler_b": "b", "metric": "m", "region": "r",
           "condition_a": {"source": "x", "median_effect": 0.2}, "condition_b": {"source": "y", "median_effect": -0.2}}
    gap = (-0.45, -0.35)
    v = verdict(att, rev, gap)
    assert v["drivers"] == ["arrival", "burstiness"] and v["kind"] == "single feature" and v["flip_reproduced"]
    assert v["sentence"].startswith("a vs b on m at r (x +0.200, y -0.200): the flip follows the arrival process")
    none = verdict({"input": att["input"]}, rev, gap)
    assert none["kind"] == "interaction" and "no single feature" in none["sentence"]
    # a gap whose interval holds 0 is not attributed; the same sign on both sides is no flip
    flat = verdict(att, rev, (-0.1, 0.05))
    assert flat["kind"] == "no gap" and flat["drivers"] == [] and "nothing to attribute" in flat["sentence"]
    same = dict(rev, condition_b={"source": "y", "median_effect": 0.6, "store_effect": -0.2})
    same["condition_a"] = dict(rev["condition_a"], store_effect=0.2)
    v2 = verdict(att, same, (0.3, 0.5))
    assert not v2["flip_reproduced"] and "no flip here" in v2["sentence"] and "the store had" in v2["sentence"]


def test_ranked_reversals_number_the_study_form_strongest_first():
    res = {"study_form": {"reversals": [
        {"metric": "ttft_p99_s", "practical_threshold": 0.05, "items": [
            {"scheduler_pair": "edf = vllm-fcfs vs orca", "region": "severe", "source_a": "a", "source_b": "b",
             "effect_a": 0.1, "effect_b": -0.5}]},
        {"metric": "slo_attainment_standard", "practical_threshold": 0.02, "items": [
            {"scheduler_pair": "sjf vs vtc", "region": "high", "source_a": "a", "source_b": "c",
             "effect_a": -0.1, "effect_b": 0.3}]}]}}
    items = ranked_reversals(res)
    assert [i["id"] for i in items] == [1, 2]
    assert items[0]["metric"] == "slo_attainment_standard"  # 0.1 / 0.02 = 5 > 0.1 / 0.05 = 2
    assert (items[1]["scheduler_a"], items[1]["scheduler_b"]) == ("edf", "orca")
    with pytest.raises(SchedportError, match="no study_form"):
        ranked_reversals({})


# --------------------------------------------------------------------------- CLI and report


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True)
    p.output = p.stdout + p.stderr
    p.exit_code = p.returncode
    return p


def test_cli_writes_the_json_and_refuses_bad_input_in_one_line(burst, tmp_path):
    res, d = burst
    out = tmp_path / "why.json"
    r = _cli("explain", "--results", str(res), "--pair", "fastserve,spf", "--metric", "ttft_p90_s",
             "--region", "r", "--sources", "bursty,smooth", "--out", str(out), "--workers", "1")
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    assert got["attribution"] == d["attribution"] and "arrival process" in r.output
    for args, msg in [(("--pair", "fastserve,nosuch", "--metric", "ttft_p90_s", "--region", "r", "--sources",
                        "bursty,smooth"), "scheduler 'nosuch'"),
                      (("--pair", "fastserve,spf", "--metric", "ttft_p90_s", "--region", "r"),
                       "missing --sources"),
                      (("--pair", "fastserve,spf", "--metric", "ttft_p90_s", "--region", "r", "--sources",
                        "bursty,smooth", "--features", "colour"), "unknown colour")]:
        r = _cli("explain", "--results", str(res), *args)
        assert r.exit_code == 2, (args, r.output)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], r.output


def test_reversal_by_number_from_portability(burst, tmp_path):
    import shutil

    res, d = burst
    store = tmp_path / "store"
    shutil.copytree(res, store, ignore=shutil.ignore_patterns("explain"))
    from schedport.analysis.portability import analyze

    pj = analyze(store, n_boot=20, n_splits=5, robustness=False)   # a real analysis, with one planted flip
    pj["study_form"]["reversals"] = [{**pj["study_form"]["reversals"][0], "metric": "ttft_p90_s",
                                      "practical_threshold": 0.05, "items": [
        {"scheduler_pair": "spf vs fastserve", "region": "r", "source_a": "bursty", "source_b": "smooth",
         "effect_a": 0.34, "effect_b": -0.05}]}]
    (store / "portability.json").write_text(json.dumps(pj))
    r = _cli("explain", "--results", str(store), "--list")
    assert r.exit_code == 0 and "spf vs fastserve @ r" in r.output
    got = explain(store, reversal=1, workers=1, progress=False, cache_dir=res / "explain", features=["arrival"])
    assert got["reversal"]["scheduler_a"] == "spf" and got["reversal"]["id"] == 1
    assert got["reversal"]["condition_a"]["store_effect"] == 0.34
    # A and B swapped: the effects change sign, the share does not
    assert got["attribution"]["arrival"]["share"] == pytest.approx(d["attribution"]["arrival"]["share"])
    with pytest.raises(SchedportError, match="between 1 and 1"):
        explain(store, reversal=2, workers=1, progress=False)
    # an analysis that is missing or not JSON (a truncated copy) is one line naming the file
    for text, msg in [(None, "missing; run `schedport analyze"), ('{"study_form": ', "not valid JSON"),
                      ("[1, 2]", "expected a JSON object")]:
        pj_path = store / "portability.json"
        pj_path.unlink(missing_ok=True)
        if text is not None:
            pj_path.write_text(text)
        for args in (("--list",), ("--reversal", "1")):
            r = _cli("explain", "--results", str(store), *args)
            lines = [ln for ln in r.output.splitlines() if ln.strip()]
            assert r.exit_code == 2 and len(lines) == 1, (text, args, r.output)
            assert str(pj_path) in lines[0] and msg in lines[0], (text, args, r.output)


def test_report_section_renders_the_figure_and_sentence(burst):
    _, d = burst
    html = render_section({"explain": {"k": 1, "ids": [1], "n_reversals": 1, "explained": [d]}})
    assert "Why it flips" in html and "data:image/png;base64" in html
    assert d["verdict"]["sentence"].split(":")[0] in html
    assert render_section({}) == ""
    flat = dict(d, verdict=dict(d["verdict"], kind="no gap"))
    assert "Shares not shown" in render_section({"explain": {"k": 1, "ids": [2], "selection": "2", "n_reversals": 2,
                                                             "explained": [flat]}})


def test_bad_requests_are_one_line_errors(burst):
    res, _ = burst
    named = dict(pair="fastserve,spf", metric="ttft_p90_s", region="r", sources="bursty,smooth")
    cases = [(dict(named, metric="iterations"), "not a ranked metric"),
             (dict(named, region="nowhere"), "'nowhere' is not in the store"),
             (dict(named, sources="bursty,bursty"), "two different sources"),
             (dict(named, pair="spf"), "two different schedulers"),
             (dict(reversal=1), "portability.json: missing"),
             (dict(named, reversal=1), "not both")]
    for kw, msg in cases:
        with pytest.raises(SchedportError, match=msg) as e:
            explain(res, workers=1, progress=False, **kw)
        assert "\n" not in str(e.value)


def test_analyze_explain_adds_why_it_flips_to_the_report(lengths, tmp_path):
    import shutil

    res, d = lengths
    store = tmp_path / "store"
    shutil.copytree(res, store)  # with its explain cache: the variant runs are reused
    r = _cli("analyze", "--results", str(store), "--explain", "1", "--boot", "200", "--splits", "20")
    assert r.exit_code == 0, r.output
    pj = json.loads((store / "portability.json").read_text())
    ex = pj["explain"]
    assert ex["k"] == 1 and ex["n_reversals"] >= 1 and len(ex["explained"]) == 1
    got = ex["explained"][0]
    assert got["reversal"]["id"] == 1 and got["verdict"]["drivers"] == ["output"]
    html = (store / "report.html").read_text()
    assert "Why it flips" in html and "output lengths" in html
    assert "why #1:" in r.output


def test_add_explanations_writes_portability_json_and_renders_nothing(tmp_path, monkeypatch):
    import schedport.analysis.explain as ex

    d = {"reversal": {"id": 2}, "verdict": {"sentence": "a vs b: the flip follows the arrival process."}}
    block = {"k": 1, "selection": "2", "ids": [2], "n_reversals": 3, "explained": [d]}
    monkeypatch.setattr(ex, "explain_top", lambda *a, **kw: block)
    res = {"parameters": {"n_boot": 10}}
    got = ex.add_explanations(res, tmp_path, tmp_path, "2")
    assert got is res and res["explain"] == block
    assert json.loads((tmp_path / "portability.json").read_text()) == res
    assert sorted(p.name for p in tmp_path.iterdir()) == ["portability.json"]  # no report, no temporary file
    assert ex.explanation_lines(res) == ["why #2: a vs b: the flip follows the arrival process."]
    assert ex.explanation_lines({}) == []


def test_explain_selection_is_k_or_a_list_of_numbers():
    from schedport.analysis.explain import parse_selection

    assert parse_selection("3", 10) == [1, 2, 3] and parse_selection(12, 4) == [1, 2, 3, 4]
    assert parse_selection("3,6,10", 10) == [3, 6, 10]
    for bad, msg in (("0", "at least 1"), ("2,11", "between 1 and 10"), ("2,2", "distinct"), ("x", "expected K")):
        with pytest.raises(SchedportError, match=msg):
            parse_selection(bad, 10)


def test_a_window_with_a_warm_up_gets_no_variant_yet():
    """A variant is rebuilt from the window's columns and would silently lose its warm-up (and
    its prefix identity): refused in one line until variants carry them."""
    warm = Trace.from_arrays([0.0, 1.0, 2.0, 3.0], [10, 20, 30, 40], [1, 2, 3, 4], name="w", warmup=1)
    v = Variant("burstiness", warm.name, warm.content_sha256())
    with pytest.raises(SchedportError, match="window w has a warm-up") as info:
        build_variant(v, warm)
    assert "\n" not in str(info.value)
    assert build_variant(Variant("original", warm.name, warm.content_sha256()), warm) is warm
