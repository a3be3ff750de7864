"""Deployment profiles: the fit from Vidur's profiles, the engine config they make, the variant sets."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from schedport.engine.core.config import GIB, engine_config_from_dict, load_engine_config
from schedport.engine.core.deployments import DEPLOYMENT_SPECS, deployment, engine_overlay
from schedport.engine.core.latency import CalibratedLatency, make_latency_model
from schedport.engine.core.profilefit import ProfileError, fit_all, fit_deployment, read_sums
from schedport.errors import ConfigError, SchedportError
from schedport.study.variants import load_variant_set, variant_configs
from _paths import REPO

PROFILES = REPO.parent / "shared" / "calibration" / "vidur-profiles"
needs_profiles = pytest.mark.skipif(not (PROFILES / "SHA256SUMS").exists(), reason="shared vidur-profiles absent")
#: The default engine config's hash before deployments existed (docs/engine.md §3.7 keeps it).
DEFAULT_HASH = "5c29185ca9f5dce7a9744adaf28b9f3561d8e399b51078c38b1eb07dcacc46e7"


def _cfg(name: str):
    d = load_engine_config(None).to_dict()
    d["engine"].pop("num_gpu_blocks")
    d["engine"].update(engine_overlay(name))
    d["latency"]["deployment"] = name
    return engine_config_from_dict(d, source=name)


def test_default_config_and_model_unchanged():
    cfg = load_engine_config(None)
    assert cfg.config_hash() == DEFAULT_HASH
    assert "tensor_parallel_size" not in cfg.to_dict()["engine"]
    assert "deployment" not in cfg.to_dict()["latency"]
    lat = make_latency_model(cfg)
    assert type(lat) is CalibratedLatency and lat.deployment is None
    assert "deployment" not in lat.describe()


@needs_profiles
def test_embedded_profiles_are_a_fresh_fit():
    fresh = fit_all(PROFILES)
    emb = json.loads((REPO / "src/schedport/engine/core/data/deployments.json").read_text())
    assert emb == json.loads(json.dumps(fresh))
    for name, d in fresh["deployments"].items():
        assert 0 < d["fit"]["nonattn_err_pct"][1] < 6, name       # mean error of the non-attention fit
        assert d["fit"]["nonattn_err_pct"][0] < 20, name
        assert set(d["labels"]) == set(d["coeffs"]), name           # every coefficient labelled


def _copy_profiles(tmp_path: Path, rel: str) -> Path:
    d = tmp_path / "prof"
    (d / rel).parent.mkdir(parents=True)
    shutil.copy(PROFILES / "SHA256SUMS", d / "SHA256SUMS")
    shutil.copy(PROFILES / rel, d / rel)
    return d


@needs_profiles
def test_missing_corrupt_and_unlisted_profile_files_are_one_line_errors(tmp_path):
    rel = "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv"
    d = _copy_profiles(tmp_path, rel)
    assert fit_deployment(d, "llama2-7b-h100")["coeffs"] == deployment("llama2-7b-h100")["coeffs"]
    with pytest.raises(ProfileError, match=r"Llama-2-7b-hf/mlp.csv: missing") as e:
        fit_deployment(d, "llama2-7b-a100")
    assert "\n" not in str(e.value)
    p = d / rel
    p.chmod(0o644)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(ProfileError, match=r"sha256 .* does not match SHA256SUMS") as e:
        fit_deployment(d, "llama2-7b-h100")
    assert "\n" not in str(e.value)
    (d / "SHA256SUMS").chmod(0o644)
    (d / "SHA256SUMS").write_text("not a checksum line\n")
    with pytest.raises(ProfileError, match="line 1"):
        read_sums(d)
    (d / "SHA256SUMS").unlink()
    with pytest.raises(ProfileError, match="SHA256SUMS: cannot read"):
        fit_deployment(d, "llama2-7b-h100")


def test_tp_kv_arithmetic_for_a_70b_model_over_four_gpus():
    cfg = _cfg("llama2-70b-a100-tp4")
    per_gpu = math.floor(80 * GIB * 0.9)
    pool = 4 * per_gpu - 68976648192 * 2 - 4 * math.floor(1.5 * GIB)
    block = 16 * 2 * 80 * 8 * 128 * 2
    assert cfg.num_gpu_blocks == pool // block
    assert cfg.to_dict()["engine"]["tensor_parallel_size"] == 4
    assert engine_config_from_dict(cfg.to_dict()).config_hash() == cfg.config_hash()


def test_deployment_keys_are_checked():
    d = load_engine_config(None).to_dict()
    d["latency"]["deployment"] = "llama2-7b-h100"        # but the engine keys are still Llama-3-8B's
    with pytest.raises(ConfigError, match=r"\[engine\] num_kv_heads: the calibrated latency model of deployment .llama2-7b-h100. has"):
        engine_config_from_dict(d)
    d["latency"]["deployment"] = "llama3-8b-h100"
    with pytest.raises(ConfigError, match="no public H100 profile for Llama-3-8B"):
        engine_config_from_dict(d)
    d = load_engine_config(None).to_dict()
    d["engine"]["tensor_parallel_size"] = 2
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        engine_config_from_dict(d)


@pytest.mark.parametrize("name", list(DEPLOYMENT_SPECS))
def test_deployment_latency_paths_agree(name):
    lat = make_latency_model(_cfg(name))
    kv = np.array([3, 700, 5000, 40000])
    for n in (1, 3, 64):
        v = lat.decode_times(n, kv * n)
        assert [lat.iteration_time((), n, int(k * n)) for k in kv] == list(v)
    inp, out = np.array([100, 1500]), np.array([1, 40])
    steps = [lat.prefill_time(int(i)) + sum(lat.iteration_time((), 1, int(i) + j) for j in range(1, int(o)))
             for i, o in zip(inp, out)]
    assert np.allclose(lat.alone_time(inp, out), steps, rtol=1e-12)


def test_hardware_orders_the_same_model():
    """Llama-2-7B: the H100 prefills and decodes faster than the A100, the A100 than the A40."""
    lats = {g: make_latency_model(_cfg(f"llama2-7b-{g}")) for g in ("h100", "a100", "a40")}
    pre = [lats[g].prefill_time(1024) for g in ("h100", "a100", "a40")]
    dec = [lats[g].iteration_time((), 32, 32 * 1024) for g in ("h100", "a100", "a40")]
    assert pre == sorted(pre) and dec == sorted(dec)


def test_deployments_sets_absolute_and_scaled_slo():
    base = load_engine_config(None)
    ab, sc = load_variant_set("deployments"), load_variant_set("deployments-scaled")
    assert ab.slo == "absolute" and "slo" not in ab.to_dict()
    assert sc.to_dict()["slo"] == "scaled" and ab.digest() != sc.digest()
    assert [v.name for v in ab.variants] == [v.name for v in sc.variants]
    assert len(ab.variants) >= 5
    for (_, cfa), (_, cfs) in zip(variant_configs(ab, base), variant_configs(sc, base)):
        assert cfa.slo_profiles == base.slo_profiles
        assert cfs.slo_profiles != base.slo_profiles
    h100 = dict((v.name, c) for v, c in variant_configs(sc, base))["llama2-7b-h100"]
    a40 = dict((v.name, c) for v, c in variant_configs(sc, base))["llama2-7b-a40"]
    assert h100.slo_profiles["strict"][0] < 0.5 < a40.slo_profiles["strict"][0]


def test_scaled_slo_set_keys_are_checked(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "x"\nslo = "relative"\n[variants.a]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n')
    with pytest.raises(SchedportError, match="slo must be one of absolute, scaled"):
        load_variant_set(p)


def test_fit_tool_reports_a_missing_profile_directory_in_one_line(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(REPO / "tools" / "fit_deployments.py"), "--dir", str(tmp_path), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "SHA256SUMS: cannot read" in r.stderr and "Traceback" not in r.stderr


@needs_profiles
def test_fit_tool_check_passes():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(REPO / "tools" / "fit_deployments.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "embedded deployments.json matches a fresh fit" in r.stdout


@needs_profiles
@pytest.mark.parametrize("column", ["time_stats.mlp_up_proj.median", "num_tokens"])
@pytest.mark.parametrize("value", ["abc", "-5", "nan", "inf", "0", ""])
def test_fit_tool_check_reports_a_bad_profile_value_in_one_line(tmp_path, column, value):
    """Issue 64 #17: a profile whose checksum is right but whose value is not a finite number > 0 is one
    line naming file, line and column, exit 2 (not a traceback, not a silently different fit)."""
    import hashlib
    import subprocess
    import sys

    import pandas as pd

    d = tmp_path / "prof"
    shutil.copytree(PROFILES, d)
    rel = "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv"
    (d / rel).chmod(0o644)
    df = pd.read_csv(d / rel, dtype=str)
    df.loc[3, column] = value
    df.to_csv(d / rel, index=False)
    h = hashlib.sha256((d / rel).read_bytes()).hexdigest()
    sums = d / "SHA256SUMS"
    sums.chmod(0o644)
    sums.write_text("".join(f"{h}  ./{rel}\n" if ln.endswith(rel) else ln + "\n"
                            for ln in sums.read_text().splitlines()))
    r = subprocess.run([sys.executable, str(REPO / "tools" / "fit_deployments.py"), "--dir", str(d), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"Llama-2-7b-hf/mlp.csv: line 5: column {column!r}" in r.stderr and "not a finite number > 0" in r.stderr


def test_long_context_deployment_kv_arithmetic_and_calibrated_latency():
    """Llama-3.1-8B at 128k on one A100: Llama-3-8B's shape and calibration, 131,072-token context."""
    name = "llama3.1-8b-a100-128k"
    assert name not in json.loads((REPO / "src/schedport/engine/core/data/deployments.json").read_text())["deployments"]
    cfg = _cfg(name)
    base = load_engine_config(None)
    kv_per_token = 2 * 32 * 8 * 128 * 2                      # K and V, 32 layers, 8 KV heads, head dim 128, bf16
    assert kv_per_token == 131_072
    pool = math.floor(80 * GIB * 0.9) - 8030261248 * 2 - math.floor(1.5 * GIB)
    assert cfg.num_gpu_blocks == pool // (16 * kv_per_token) == base.num_gpu_blocks == 28_437
    assert cfg.max_model_len == 131_072 and base.max_model_len == 8192
    assert cfg.num_gpu_blocks // (131_072 // 16) == 3          # three full-context requests fit at once
    lat, ref = make_latency_model(cfg), make_latency_model(base)
    assert lat.coeffs == ref.coeffs and lat.describe()["deployment"] == name
    for n in (1, 512, 8192):
        assert lat.prefill_time(n) == ref.prefill_time(n)
    assert set(lat.describe()["labels"]) == set(ref.coeffs) and lat.describe()["hardware"] == "A100-80GB SXM, TP=1"
    with pytest.raises(ConfigError, match="max_model_len"):       # the context comes with the deployment
        d = cfg.to_dict()
        d["engine"]["max_model_len"] = 8192
        engine_config_from_dict(d)


def test_long_context_deployment_serves_what_the_study_engine_refuses():
    from schedport.engine.runner import simulate
    from schedport.workload.trace import Trace

    trace = Trace.from_arrays([0.0, 0.5, 1.0], [126_195, 40_000, 900], [20, 10, 5])
    long = simulate(trace, "vllm-fcfs", _cfg("llama3.1-8b-a100-128k"), seed=0).requests
    short = simulate(trace, "vllm-fcfs", load_engine_config(None), seed=0).requests
    assert list(long["status"]) == ["completed"] * 3
    assert list(short["status"]) == ["rejected", "rejected", "completed"]
