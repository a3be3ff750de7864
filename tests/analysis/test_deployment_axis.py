"""Deployment as a comparison kind (`schedport.analysis.deployments`): cross-deployment reversals
and concordance on planted stores, and the report section "Across deployments"."""

from __future__ import annotations

from pathlib import Path

import pytest

from _synthstore import MANIFEST, write_store
from schedport.analysis.deployments import is_deployment_set
from schedport.analysis.portability import analyze
from schedport.engine.core.config import EngineConfig
from schedport.engine.core.deployments import engine_overlay
from schedport.study.variants import load_variant_set, variant_configs, variant_store, write_set_record
from test_simulator_axis import cost_ratio, planted_runs


def _overlay(extra_latency: str = "", extra_engine: str = "") -> str:
    eng = ", ".join(f"{k} = {v!r}" for k, v in engine_overlay("llama2-7b-a100").items()) + extra_engine
    return f'{{ engine = {{ {eng} }}, latency = {{ deployment = "llama2-7b-a100"{extra_latency} }} }}'


def write_deployment_study(path: Path, tmp: Path) -> None:
    """Three deployments beside the default: Llama-2-7B on an A100, the same with prefill twice as
    dear (the only difference), and the same with another KV reserve (the same costs)."""
    f = tmp / "planted.toml"
    f.write_text('name = "planted-deployments"\ndescription = "Llama-2-7B on an A100, planted"\n'
                 f'[variants.a100]\nwhy = "w"\noverlay = {_overlay()}\n'
                 f'[variants.a100-slow-prefill]\nwhy = "w"\noverlay = {_overlay(", prefill_scale = 2.0")}\n'
                 f'[variants.a100-copy]\nwhy = "w"\noverlay = {_overlay(extra_engine=", activation_reserve_gib = 2.0")}\n')
    base = EngineConfig()
    vset = load_variant_set(f)
    configs = variant_configs(vset, base)
    r0 = cost_ratio(dict((v.name, c) for v, c in configs)["a100"])
    for name, cfg in [("default", base)] + [(v.name, c) for v, c in configs]:
        man = {**MANIFEST, "engine_config": cfg.to_dict(), "engine_hash": cfg.config_hash()}
        write_store(variant_store(path, name), planted_runs(cost_ratio(cfg), r0), man)
    write_set_record(path, vset, configs)


def test_prefill_sensitive_pair_reverses_across_deployments_and_the_identity_pair_does_not(tmp_path):
    write_deployment_study(tmp_path / "s", tmp_path)
    res = analyze(tmp_path / "s", n_boot=200, n_splits=50, robustness=False)
    dep = res["deployments"]
    assert dep["slo"] == "absolute" and dep["sources"] == ["azure", "bailian"]
    pairs = {(r["deployment_a"], r["deployment_b"], r["scheduler_pair"], r["source"]) for r in dep["reversals"]}
    # prefill twice as dear: prefill-first's 7% win on azure becomes a loss, a cross-deployment reversal
    assert ("a100", "a100-slow-prefill", "decode-first vs prefill-first", "azure") in pairs
    # the same costs: no reversal at all between them, and their rankings agree exactly
    assert not [r for r in dep["reversals"] if {r["deployment_a"], r["deployment_b"]} == {"a100", "a100-copy"}]
    same = [t for t in dep["tau_by_metric"] if (t["deployment_a"], t["deployment_b"]) == ("a100", "a100-copy")]
    assert same and all(t["median"] == pytest.approx(1.0) and t["min"] == pytest.approx(1.0) for t in same)
    # a flip between sources that no deployment moves is no cross-deployment reversal
    assert not [r for r in dep["reversals"] if r["scheduler_pair"] == "flip-a vs flip-b"]
    assert dep["n_reversals"] == len(dep["reversals"]) == sum(m["n_reversals"] for m in dep["by_metric"].values())
    cis = [c for c in dep["concordance"] if c["ci_low"] is not None]
    assert cis and all(c["ci_low"] <= c["ci_high"] for c in cis)    # tau with a CI over windows
    from schedport.report.deployments import deployments_section

    html = deployments_section(res)
    assert "Across deployments" in html and "absolute SLO thresholds" in html and "a100-slow-prefill" in html


def test_uncertainty_set_is_not_a_deployment_set_and_a_plain_store_has_no_block(tmp_path):
    assert not is_deployment_set(load_variant_set("uncertainty").to_dict())
    assert is_deployment_set(load_variant_set("deployments").to_dict())
    from schedport.report.deployments import deployments_section

    assert deployments_section({}) == ""


def test_analyze_prints_the_deployment_axis(tmp_path):
    write_deployment_study(tmp_path / "s", tmp_path)
    res = analyze(tmp_path / "s", n_boot=100, n_splits=20, robustness=False)
    from schedport.cli.analyze import deployment_lines
    from schedport.report.simulator import simulator_card

    lines = deployment_lines(res)
    assert lines[0].startswith("deployments: 4 (planted-deployments, absolute SLO thresholds), ")
    assert f"{res['deployments']['n_reversals']} cross-deployment reversals" in lines[0]
    assert any(ln.startswith("strongest: ") for ln in lines)
    assert "calibration's fit errors" not in simulator_card(res)       # the card says what the variants are
