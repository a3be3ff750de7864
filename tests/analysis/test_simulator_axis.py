"""The simulator as an axis (docs/engine.md §3.6, portability.json ``simulator``).

* planted: two policies whose order in one source follows the engine's prefill-to-decode cost
  ratio (worked out from each variant's own latency model) give a reversal marked fragile; a
  pair that flips by 30% whatever the engine is robust, and a dominant ordering is a robust
  stable ranking;
* variant sets: bad input is one line (unknown set, unknown overlay key, a variant equal to the
  default, a store that holds another set);
* `run --variants` end to end on a tiny selection: one store per variant, the default's cells
  reused, and the same rows on a second run and with one worker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from _synthstore import MANIFEST, METRICS_MAIN, write_store
from schedport.analysis.portability import analyze
from schedport.engine.core.config import EngineConfig
from schedport.engine.core.latency import make_latency_model
from schedport.errors import SchedportError
from schedport.study.variants import (load_variant_set, variant_configs, variant_store, write_set_record)
from _paths import REPO

ROOT = REPO
SOURCES = ["azure", "bailian"]
SCHEDS = ["prefill-first", "decode-first", "good", "bad", "flip-a", "flip-b"]
#: Each scheduler's cost factor (azure, bailian); prefill-first's on bailian follows the engine.
QUALITY = {"prefill-first": (0.93, 1.07), "decode-first": (1.0, 1.0), "good": (1.0, 1.0), "bad": (1.4, 1.4),
           "flip-a": (1.0, 1.3), "flip-b": (1.3, 1.0)}


def cost_ratio(cfg: EngineConfig) -> float:
    """What a 512-token prefill costs against a batch-64 decode step, on `cfg`'s latency model."""
    lat = make_latency_model(cfg)
    return lat.iteration_time(((512, 0),), 0, 0) / lat.iteration_time((), 64, 64 * 1024)


def planted_runs(ratio: float, base_ratio: float, n_windows: int = 12, seed: int = 0) -> pd.DataFrame:
    """Runs of six schedulers on two sources and one region. prefill-first beats decode-first by
    7% on azure and loses by 7% on bailian; as prefills get dearer relative to decodes (x, the
    cost ratio's relative change) prefill-first loses 2x on both (by construction), so a 1% shift
    either way takes one side of the flip under the 5% threshold. good beats bad by 40%
    everywhere; flip-a beats flip-b by 30% on azure and loses by 30% on bailian, whatever the
    engine."""
    rng = np.random.default_rng(seed)
    x = ratio / base_ratio - 1.0
    rows = []
    for s in SOURCES:
        for w in range(n_windows):
            wf = rng.lognormal(0, 0.4)
            for sc in SCHEDS:
                row = {"source": s, "window_id": f"{s}-{w:02d}", "region": "high", "scheduler": sc, "seed": 0,
                       "rho": 0.8, "time_scale": 1.0}
                q = QUALITY[sc][s == "bailian"]      # >1 is worse, by that factor
                if sc == "prefill-first":
                    q += 2 * x
                for name, base, d in METRICS_MAIN:
                    row[name] = base * wf * q ** (-d) * rng.lognormal(0, 0.01)
                rows.append(row)
    return pd.DataFrame(rows)


def write_variant_study(path: Path, vset_spec="uncertainty") -> dict:
    base = EngineConfig()
    vset = load_variant_set(vset_spec)
    configs = variant_configs(vset, base)
    r0 = cost_ratio(base)
    for name, cfg in [("default", base)] + [(v.name, c) for v, c in configs]:
        man = {**MANIFEST, "engine_config": cfg.to_dict(), "engine_hash": cfg.config_hash()}
        write_store(variant_store(path, name), planted_runs(cost_ratio(cfg), r0), man)
    write_set_record(path, vset, configs)
    return {v.name: cost_ratio(c) / r0 - 1 for v, c in configs}


def test_planted_prefill_decode_flip_is_fragile_and_a_dominant_order_robust(tmp_path):
    shifts = write_variant_study(tmp_path)
    res = analyze(tmp_path, n_boot=200, n_splits=50, robustness=False)
    sim = res["simulator"]
    assert sim["n_variants"] == 12 and sim["set"]["name"] == "uncertainty"
    by_pair = {(r["scheduler_pair"], r["metric"]): r for r in sim["reversals"]}
    ratio_flip = by_pair[("decode-first vs prefill-first", "e2e_mean_s")]
    # it fails exactly where the cost ratio moved enough to bring one side's effect under the 5%
    # threshold (no variant lands near that edge): all but the KV-budget variants
    def rel(q):                                       # prefill-first's effect against decode-first
        return (1.0 - q) / ((1.0 + q) / 2)
    effect = {v: min(rel(0.93 + 2 * x), -rel(1.07 + 2 * x)) for v, x in shifts.items()}
    assert all(abs(e - 0.05) > 0.005 for e in effect.values())
    assert set(ratio_flip["fails_under"]) == {v for v, e in effect.items() if e < 0.05}
    assert set(ratio_flip["fails_under"]) == set(shifts) - {"kv-reserve-1gib", "kv-reserve-3gib"}
    assert ratio_flip["class"] == "fragile" and ratio_flip["survival"] < 0.5
    robust = by_pair[("flip-a vs flip-b", "e2e_mean_s")]
    assert robust["survival"] == 1.0 and robust["class"] == "robust" and robust["fails_under"] == []
    dominant = [s for s in sim["stable"] if {s["winner"], s["loser"]} == {"good", "bad"}]
    assert dominant and all(s["winner"] == "good" and s["class"] == "robust" for s in dominant)
    assert sim["distribution"]["all"] >= 1 and sim["distribution"]["under_50"] >= 1
    pred = sim["predicted"]
    assert pred["most_stable_ranking"]["survival"] == 1.0
    from schedport.cli.analyze import simulator_lines     # what `schedport analyze` prints of it

    lines = simulator_lines(res)
    assert lines[0].startswith(f"simulator: {sim['distribution']['all']} of {len(sim['reversals'])} reversals survive "
                               "all 12 engine variants of uncertainty")
    assert any(ln.startswith("strongest reversal: ") and "survives" in ln for ln in lines)
    assert any(ln.startswith("most stable ranking: ") and "12 of 12" in ln for ln in lines)
    # every claim's verdict is counted over the 12 variants
    assert all(c["n_variants"] == 12 and len(c["by_variant"]) == 12 for c in sim["claims"])
    # the default's own analysis is the plain one: the simulator block is all that was added
    plain = tmp_path / "plain"
    write_store(plain, pd.read_parquet(tmp_path / "runs"), {**MANIFEST, "engine_config": EngineConfig().to_dict(),
                                                           "engine_hash": EngineConfig().config_hash()})
    other = analyze(plain, n_boot=200, n_splits=50, robustness=False)
    for key in ("study_form", "rankings", "headline"):
        assert other[key] == res[key]


def test_rank_tau_between_variants_is_one_where_nothing_moves(tmp_path):
    write_variant_study(tmp_path)
    sim = analyze(tmp_path, n_boot=100, n_splits=20, robustness=False)["simulator"]
    taus = {(t["variant_a"], t["variant_b"]): t for t in sim["rank_tau"]}
    assert len(taus) == 13 * 12 // 2
    # the KV budget does not enter the planted values: those two variants rank as the default does
    assert taus[("default", "kv-reserve-1gib")]["min"] == pytest.approx(1.0)
    # a 20% dearer prefill moves prefill-first past decode-first on azure: that ranking changes
    assert taus[("default", "shift-to-prefill")]["min"] < 1.0
    assert sim["rank_tau_vs_default"]["min"] < 1.0


# ------------------------------------------------------------------------------- bad input
def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def one_line(p) -> str:
    assert p.returncode != 0, p.stdout
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


@pytest.mark.parametrize("text,needle", [
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { latency = { prefil_scale = 1.1 } }\n',
     "unknown key 'prefil_scale'"),
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.0 } }\n',
     "leaves the default engine config unchanged"),
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n'
     '[variants.b]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.10 } }\n', "variant 'a''s"),
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { slo = { strict = { ttft_s = 1 } } }\n',
     "an overlay changes [engine] and [latency] only"),
    ('name = "x"\n[variants.default]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n',
     "not 'default'"),
    ('name = "x"\n[variants.a]\noverlay = { latency = { decode_scale = 1.1 } }\n', "needs why"),
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = -1 } }\n', "must be a number > 0"),
    ('name = "x"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 }\n', "invalid TOML"),
])
def test_bad_variant_set_is_one_line(tmp_path, text, needle):
    f = tmp_path / "set.toml"
    f.write_text(text)
    msg = one_line(cli("run", "--variants", f, "--corpus", tmp_path / "no-corpus", "--out", tmp_path / "out"))
    assert needle in msg and ("set.toml" in msg or "'x'" in msg)
    assert not (tmp_path / "no-corpus").exists()      # refused before a corpus build


def test_unknown_variant_set_is_one_line(tmp_path):
    msg = one_line(cli("run", "--variants", "uncertainy", "--out", tmp_path / "out"))
    assert "unknown variant set 'uncertainy'" in msg and "uncertainty" in msg


def test_a_store_of_another_set_is_refused(tmp_path):
    vset = load_variant_set("uncertainty")
    write_set_record(tmp_path, vset, variant_configs(vset, EngineConfig()))
    f = tmp_path / "mine.toml"
    f.write_text('name = "mine"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.2 } }\n')
    mine = load_variant_set(f)
    with pytest.raises(SchedportError, match="holds the variants of set 'uncertainty'"):
        write_set_record(tmp_path, mine, variant_configs(mine, EngineConfig()))


# ------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_run_variants_end_to_end_reuses_default_cells_and_is_deterministic(tmp_path):
    from schedport.study.sweep import write_demo_corpus

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=2)
    f = tmp_path / "two.toml"
    f.write_text('name = "two"\n[variants.decode-up]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n'
                 '[variants.kv-small]\nwhy = "w"\noverlay = { engine = { activation_reserve_gib = 3.0 } }\n')
    sel = ["--schedulers", "vllm-fcfs,sjf", "--regions", "moderate,overload", "--windows", "2", "--no-analyze"]
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "plain", *sel, "--workers", "2")
    assert p.returncode == 0, p.stderr
    shutil.copytree(tmp_path / "plain", tmp_path / "v")
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "v", *sel, "--variants", f, "--workers", "2")
    assert p.returncode == 0, p.stderr
    assert "variants: 3 engines" in p.stdout
    # the default's cells were reused, not rerun: its parts are the plain run's files
    assert sorted(x.name for x in (tmp_path / "v" / "runs").iterdir()) == \
        sorted(x.name for x in (tmp_path / "plain" / "runs").iterdir())
    rec = json.loads((tmp_path / "v" / "variants" / "set.json").read_text())
    assert [v["name"] for v in rec["variants"]] == ["decode-up", "kv-small"]
    from schedport.study.variants import read_variant_table

    table = read_variant_table(tmp_path / "v")       # one table, a variant column
    assert table.groupby("variant").size().to_dict() == {"decode-up": 16, "default": 16, "kv-small": 16}
    assert (read_variant_table(tmp_path / "plain").variant == "default").all()
    # one worker gives the same rows
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "w1", *sel, "--variants", f, "--workers", "1")
    assert p.returncode == 0, p.stderr
    for name in ("decode-up", "kv-small"):
        a = pd.read_parquet(tmp_path / "v" / "variants" / name / "runs").sort_values(
            ["source", "window_id", "region", "scheduler"]).reset_index(drop=True)
        b = pd.read_parquet(tmp_path / "w1" / "variants" / name / "runs").sort_values(
            ["source", "window_id", "region", "scheduler"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
        m = json.loads((tmp_path / "v" / "variants" / name / "manifest.json").read_text())
        assert m["engine_hash"] == rec["engine_hashes"][name]


# ------------------------------------------------------------------------------- the real-engine check, predicted
def _rev(pair, metric, region, surv, eff=0.3):
    return {"scheduler_pair": pair, "metric": metric, "region": region, "source_a": "azure", "source_b": "bailian",
            "effect_a": eff, "effect_b": -eff, "survival": surv, "n_survived": int(surv * 12), "n_variants": 12,
            "fails_under": [], "class": "robust" if surv == 1 else "fragile"}


def test_predicted_check_names_the_pairs_a_real_server_can_run():
    from schedport.realengine.validate import predicted_check

    res = {"parameters": {"regions": [{"name": "high", "rho": 0.8}, {"name": "overload", "rho": 1.2}]},
           "simulator": {
               "reversals": [_rev("fastserve vs orca", "ttft_p99_s", "overload", 0.25, 0.6),
                             _rev("edf = vllm-fcfs vs sjf", "e2e_mean_s", "high", 0.5, 0.4)],
               "stable": [{"scheduler_pair": "sjf vs vllm-fcfs", "winner": "sjf", "loser": "vllm-fcfs",
                           "metric": "e2e_mean_s", "region": "overload", "effects": {"azure": 0.2, "bailian": 0.3},
                           "strength": 0.2, "survival": 1.0, "n_survived": 12, "n_variants": 12},
                          {"scheduler_pair": "fastserve vs sjf", "winner": "sjf", "loser": "fastserve",
                           "metric": "e2e_mean_s", "region": "high", "effects": {"azure": 0.5, "bailian": 0.5},
                           "strength": 0.5, "survival": 1.0, "n_survived": 12, "n_variants": 12}],
               "predicted": {"strongest_reversal": _rev("fastserve vs orca", "ttft_p99_s", "overload", 0.25, 0.6)}}}
    got = predicted_check(res)
    assert got["reversal"]["scheduler_pair"] == "edf = vllm-fcfs vs sjf"
    assert (got["reversal"]["run_a"], got["reversal"]["run_b"]) == ("edf", "sjf")
    assert got["stable_ranking"]["winner"] == "sjf" and got["stable_ranking"]["loser"] == "vllm-fcfs"
    assert got["schedulers"] == ["edf", "sjf", "vllm-fcfs"]
    assert got["regions"] == {"high": 0.8, "overload": 1.2} and got["sources"] == ["azure", "bailian"]
    assert "cannot run" in got["note"]


def test_validate_predicted_without_variants_is_one_line(tmp_path):
    write_store(tmp_path / "plain", planted_runs(1.0, 1.0), dict(MANIFEST))
    analyze(tmp_path / "plain", n_boot=20, n_splits=10, robustness=False)
    f = tmp_path / "plain" / "portability.json"
    eng = tmp_path / "engine.toml"
    eng.write_text("")
    msg = one_line(cli("validate", "--endpoint", "http://127.0.0.1:9", "--engine", eng, "--out", tmp_path / "v",
                       "--corpus", tmp_path / "c", "--predicted", f))
    assert "has no simulator block" in msg and "--variants uncertainty" in msg


def test_a_corpus_spec_names_the_variants_of_its_study(tmp_path):
    """`variants = "..."` in a corpus spec: recorded in the manifest (outside the corpus hash) and
    run by `schedport run` when no --variants is given."""
    from schedport.workload.corpus import build_corpus
    from schedport.workload.examples import make_example_trace
    from schedport.workload.trace import save_trace

    save_trace(make_example_trace(n_requests=240, seed=3), tmp_path / "mine.csv")
    f = tmp_path / "two.toml"
    f.write_text('name = "two"\n[variants.decode-up]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n')
    body = ('name = "mine-study"\n[[sources]]\nname = "mine"\nadapter = "canonical"\ncite = "ours"\n'
            'files = ["mine.csv"]\nwindows = { rule = "tile", count = 3 }\n')
    (tmp_path / "plain.toml").write_text(body)
    (tmp_path / "with.toml").write_text('variants = "two.toml"\n' + body)
    a = build_corpus(spec=tmp_path / "plain.toml", data_dir=tmp_path, out=tmp_path / "ca")
    b = build_corpus(spec=tmp_path / "with.toml", data_dir=tmp_path, out=tmp_path / "cb")
    assert a.corpus_sha256 == b.corpus_sha256
    assert b.manifest["study"] == {"variants": str(f.resolve())} and "study" not in a.manifest
    p = cli("run", "--corpus", tmp_path / "cb", "--out", tmp_path / "out", "--schedulers", "vllm-fcfs,sjf",
            "--regions", "moderate", "--no-analyze", "--workers", "1")
    assert p.returncode == 0, p.stderr
    assert "named by the corpus spec" in p.stdout
    assert (tmp_path / "out" / "variants" / "decode-up" / "manifest.json").is_file()
    (tmp_path / "bad.toml").write_text('variants = "missing.toml"\n' + body)
    with pytest.raises(Exception, match="variants: file 'missing.toml' not found beside the spec"):
        build_corpus(spec=tmp_path / "bad.toml", data_dir=tmp_path, out=tmp_path / "cc")


def test_a_variant_with_another_selection_is_flagged(tmp_path):
    write_variant_study(tmp_path)
    runs = pd.read_parquet(variant_store(tmp_path, "cpu-4ms") / "runs")
    man = json.loads((variant_store(tmp_path, "cpu-4ms") / "manifest.json").read_text())
    shutil.rmtree(variant_store(tmp_path, "cpu-4ms"))
    write_store(variant_store(tmp_path, "cpu-4ms"), runs[runs.window_id != "azure-11"], man)
    sim = analyze(tmp_path, n_boot=50, n_splits=10, robustness=False)["simulator"]
    assert sim["selection_differs"] == ["cpu-4ms"] and "cpu-4ms" in sim["note"]


def test_variants_without_reversals_are_named_on_the_first_screen(tmp_path):
    """Issue 64 #10: after `run --variants` with no reversal the first screen says the variants ran and
    had no flip to confirm, not that the simulator's error was not measured."""
    from _synthstore import REGIONS6, make_runs
    from schedport.report.answer import render_markdown

    base = EngineConfig()
    vset = load_variant_set("uncertainty")
    configs = variant_configs(vset, base)
    runs = make_runs(sources=SOURCES, schedulers=["edf", "sjf", "vllm-fcfs"], n_windows=4, regions=REGIONS6[:2])
    for name, cfg in [("default", base)] + [(v.name, c) for v, c in configs]:
        write_store(variant_store(tmp_path, name), runs,
                    {**MANIFEST, "engine_config": cfg.to_dict(), "engine_hash": cfg.config_hash()})
    write_set_record(tmp_path, vset, configs)
    r = cli("analyze", "--results", tmp_path, "--boot", 30, "--splits", 20, "--no-robustness")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "portability.json").read_text())
    assert res["simulator"]["n_variants"] == 12 and res["headline"]["flips"]["n_reversals"] == 0
    md = render_markdown(res)
    assert "not measured in this run" not in md
    assert "also run on 12 engine variants" in md and "no flip for them to confirm" in md
    assert "not measured in this run" not in (tmp_path / "report.html").read_text()
