"""Tests for schedport.engine.core.config: defaults, TOML loading, resolution rules and one-line errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib

import pytest

import schedport.engine.core.config as config_mod
from schedport.engine.core.config import (
    DEFAULT_SLO_PROFILES,
    EngineConfig,
    engine_config_from_dict,
    load_engine_config,
)
from schedport.errors import ConfigError
from schedport.engine.core.latency import (
    DEFAULT_CPU_OVERHEAD_S,
    LINEAR_DEFAULTS,
    CalibratedLatency,
    LinearLatency,
    make_latency_model,
)


def write(tmp_path, text: str, name: str = "engine.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- defaults
def test_defaults_and_kv_capacity_arithmetic():
    cfg = load_engine_config(None)
    assert cfg.block_size == 16
    assert cfg.kv_bytes_per_token == 131072  # 2 x 32 x 8 x 128 x 2
    assert cfg.block_bytes == 2 * 2**20
    mb = cfg.memory_breakdown()
    assert mb["budget_bytes"] == 77_309_411_328  # 0.9 x 80 GiB, exact
    assert mb["weights_bytes"] == 16_060_522_496
    assert mb["activation_reserve_bytes"] == 1_610_612_736
    assert mb["kv_pool_bytes"] == 59_638_276_096
    assert cfg.num_gpu_blocks == 28_437
    assert cfg.num_gpu_blocks_derived
    assert cfg.kv_capacity_tokens == 28_437 * 16
    assert cfg.max_num_seqs == 256 and cfg.max_model_len == 8192
    assert cfg.max_num_batched_tokens is None and cfg.watermark is None
    assert cfg.latency_model == "calibrated"
    assert cfg.cpu_overhead_s == DEFAULT_CPU_OVERHEAD_S and cfg.lm_head is True
    assert cfg.linear_a is None
    assert list(cfg.slo_profiles) == ["strict", "standard", "relaxed"]
    assert cfg.slo_profiles == {"strict": (0.5, 0.05), "standard": (2.0, 0.1), "relaxed": (10.0, 0.2)}
    assert cfg.horizon_factor == 1.5
    assert cfg.scheduler_params == {}
    assert EngineConfig() == cfg


@pytest.mark.parametrize("reserve,blocks", [(1.0, 28693), (1.5, 28437), (3.0, 27669)])
def test_activation_reserve_sensitivity_matches_calibration(reserve, blocks):
    # calibration.json kv_cache_capacity.num_blocks
    cfg = engine_config_from_dict({"engine": {"activation_reserve_gib": reserve}})
    assert cfg.num_gpu_blocks == blocks


def test_num_gpu_blocks_override():
    cfg = engine_config_from_dict({"engine": {"num_gpu_blocks": 600}})
    assert cfg.num_gpu_blocks == 600 and not cfg.num_gpu_blocks_derived


def test_direct_construction_validates():
    cfg = EngineConfig(num_gpu_blocks=65, max_model_len=1024)
    assert cfg.num_gpu_blocks == 65 and cfg.usable_gpu_blocks == 64
    with pytest.raises(ConfigError, match=r"^<EngineConfig>: \[engine\] max_num_seqs: must be a positive integer, got 0$"):
        EngineConfig(max_num_seqs=0)
    assert dataclasses.replace(cfg, max_num_seqs=8).max_num_seqs == 8


# --------------------------------------------------------------------------- files
FULL = """
[engine]
block_size = 32
gpu_memory_gib = 80
gpu_memory_utilization = 0.9
activation_reserve_gib = 1.5
max_num_seqs = 128
max_num_batched_tokens = 2048
max_model_len = 4096
watermark = 0.01

[latency]
model = "calibrated"
cpu_overhead_s = 0.001
lm_head = false

[slo.strict]
ttft_s = 0.25

[slo.chat]
ttft_s = 1.0
tpot_s = 0.08

[metrics]
horizon_factor = 2

[scheduler.sarathi]
chunk_size = 512
stages = [1, 2]

[scheduler.vtc]
w_p = 1.0
"""


def test_load_full_file(tmp_path):
    p = write(tmp_path, FULL)
    cfg = load_engine_config(p)
    assert cfg.source == str(p)
    assert cfg.block_size == 32
    assert cfg.num_gpu_blocks == 28437 // 2  # same pool, 4 MiB blocks
    assert cfg.max_num_seqs == 128 and cfg.max_num_batched_tokens == 2048
    assert cfg.max_model_len == 4096 and cfg.watermark == 0.01
    assert cfg.cpu_overhead_s == 0.001 and cfg.lm_head is False
    # partial override keeps the other value; new profiles come after the defaults
    assert list(cfg.slo_profiles.items()) == [
        ("strict", (0.25, 0.05)), ("standard", (2.0, 0.1)), ("relaxed", (10.0, 0.2)), ("chat", (1.0, 0.08))]
    assert cfg.horizon_factor == 2.0 and isinstance(cfg.horizon_factor, float)
    assert cfg.scheduler_params == {"sarathi": {"chunk_size": 512, "stages": [1, 2]}, "vtc": {"w_p": 1.0}}
    lat = make_latency_model(cfg)
    assert isinstance(lat, CalibratedLatency) and lat.cpu_overhead_s == 0.001 and not lat.lm_head


def test_empty_file_is_defaults(tmp_path):
    cfg = load_engine_config(write(tmp_path, ""))
    assert cfg == EngineConfig()


def test_module_docstring_example_parses():
    doc = config_mod.__doc__
    toml_text = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    cfg = engine_config_from_dict(tomllib.loads(toml_text), "docstring")
    assert cfg == EngineConfig(slo_profiles=dict(DEFAULT_SLO_PROFILES),
                               scheduler_params={"sarathi": {"chunk_size": 512}},
                               cpu_overhead_s=0.002, lm_head=True)


def test_to_dict_round_trip_and_hash():
    for d in ({}, {"latency": {"model": "linear"}}, {"latency": {"model": "linear", "a": 0.01}},
              {"engine": {"num_gpu_blocks": 1000, "watermark": 0.0}, "slo": {"x": {"ttft_s": 1, "tpot_s": 2}},
               "scheduler": {"ltr": {"quantum": 10}}}):
        cfg = engine_config_from_dict(d)
        dd = cfg.to_dict()
        text = json.dumps(dd, allow_nan=False)  # plain JSON
        back = engine_config_from_dict(json.loads(text))
        assert back == cfg
        assert back.to_dict() == dd
        canon = json.dumps(dd, sort_keys=True, separators=(",", ":"))
        assert cfg.config_hash() == hashlib.sha256(canon.encode()).hexdigest()
        assert back.config_hash() == cfg.config_hash()
        assert hash(back) == hash(cfg)
    assert engine_config_from_dict({}).to_dict()["engine"]["num_gpu_blocks"] == 28437
    h0 = EngineConfig().config_hash()
    assert EngineConfig(max_num_seqs=255).config_hash() != h0
    assert EngineConfig(source="elsewhere").config_hash() == h0  # the source is not content


# --------------------------------------------------------------------------- latency keys
def test_linear_defaults_only_when_no_coefficient_given():
    cfg = engine_config_from_dict({"latency": {"model": "linear"}})
    assert (cfg.linear_a, cfg.linear_b, cfg.linear_c, cfg.linear_d) == tuple(LINEAR_DEFAULTS[k] for k in "abcd")
    assert cfg.cpu_overhead_s is None and cfg.lm_head is None


def test_linear_any_coefficient_given_zeroes_the_rest(tmp_path):
    cfg = load_engine_config(write(tmp_path, '[latency]\nmodel = "linear"\na = 0.01\n'))
    assert (cfg.linear_a, cfg.linear_b, cfg.linear_c, cfg.linear_d) == (0.01, 0.0, 0.0, 0.0)
    lat = make_latency_model(cfg)
    assert isinstance(lat, LinearLatency)
    assert lat.iteration_time(((300, 10),), 40, 9000) == 0.01
    cfg = engine_config_from_dict({"latency": {"model": "linear", "d": 1e-9, "a": 0.002}})
    assert (cfg.linear_a, cfg.linear_b, cfg.linear_c, cfg.linear_d) == (0.002, 0.0, 0.0, 1e-9)


def test_linear_integer_coefficients_accepted():
    cfg = engine_config_from_dict({"latency": {"model": "linear", "a": 1, "b": 0}})
    assert cfg.linear_a == 1.0 and isinstance(cfg.linear_a, float)


def test_linear_e_is_the_fifth_coefficient(tmp_path):
    """e defaults to 0 (also with the fitted defaults), counts as "a coefficient given" and
    reaches the latency model."""
    assert engine_config_from_dict({"latency": {"model": "linear"}}).linear_e == 0.0
    assert engine_config_from_dict({"latency": {"model": "linear", "a": 0.01}}).linear_e == 0.0
    assert EngineConfig().linear_e is None                      # calibrated: not applicable
    cfg = load_engine_config(write(tmp_path, '[latency]\nmodel = "linear"\na = 0.004\ne = 2.5e-10\n'))
    assert (cfg.linear_a, cfg.linear_b, cfg.linear_c, cfg.linear_d, cfg.linear_e) == (0.004, 0.0, 0.0, 0.0, 2.5e-10)
    lat = make_latency_model(cfg)
    assert isinstance(lat, LinearLatency) and lat.e == 2.5e-10
    assert lat.prefill_time(1000) == 0.004 + 2.5e-10 * 500500
    cfg = engine_config_from_dict({"latency": {"model": "linear", "a": 1, "e": 0}})
    assert cfg.linear_e == 0.0 and isinstance(cfg.linear_e, float)


def test_linear_f_is_optional_and_checked(tmp_path):
    """f (the mixed-step surcharge) defaults to 0, is left out of the resolved dict at 0 (so
    no existing config's hash moves), round-trips when set, and a negative value names the key."""
    cfg = engine_config_from_dict({"latency": {"model": "linear", "a": 0.01}})
    assert cfg.linear_f == 0.0 and "f" not in cfg.to_dict()["latency"]
    cfg = load_engine_config(write(tmp_path, '[latency]\nmodel = "linear"\na = 0.004\nf = 6e-5\n'))
    assert cfg.linear_f == 6e-5 and make_latency_model(cfg).f == 6e-5
    assert engine_config_from_dict(cfg.to_dict()).linear_f == 6e-5
    with pytest.raises(ConfigError, match=r"\[latency\] f.*>= 0"):
        engine_config_from_dict({"latency": {"model": "linear", "a": 0.01, "f": -1.0}})
    with pytest.raises(ConfigError, match=r"\bf\b"):
        engine_config_from_dict({"latency": {"model": "calibrated", "f": 1e-5}})


# Hashes of these configs: results stores and capacity caches are keyed by them, so they must not
# change by accident. `e`, `f` and `request_overhead_s` left them as they were (zero is left
# out). The vLLM 0.32 rules (`reserve_full_prompt`, `null_block`, `priority_victim_ties`,
# `over_length`) and the one host swap space (`swap_space_gib`, `pcie_gb_s`) changed what the
# default engine does, so they are written always and moved every hash once: a store made before
# them is refused as results of another engine config. The hashes before them were 090cf7eb...,
# f03ed77f... and f8faaacaa... .
PINNED_HASHES = [
    ({}, "5c29185ca9f5dce7a9744adaf28b9f3561d8e399b51078c38b1eb07dcacc46e7"),
    ({"latency": {"model": "linear"}}, "68437511b50f2371ed127f3489a462b2e4eca668e01d965e74a93d2f43ffa701"),
    ({"latency": {"model": "linear", "a": 0.01}}, "6e9a37869884abe219147d5b89e223f5e8f5a3f59018cd4e3833d548ef115c2b"),
]


@pytest.mark.parametrize("d,h", PINNED_HASHES)
def test_new_latency_keys_at_zero_keep_existing_hashes(d, h):
    cfg = engine_config_from_dict(d)
    assert cfg.config_hash() == h
    assert "e" not in cfg.to_dict()["latency"] and "request_overhead_s" not in cfg.to_dict()["latency"]
    # zero written explicitly (also -0.0) is the same config as leaving it out, as for any default
    lat = dict(d.get("latency", {}))
    lat["request_overhead_s"] = 0.0
    if lat.get("model") == "linear" and "a" in lat:
        lat["e"] = -0.0
    explicit = engine_config_from_dict({**d, "latency": lat})
    assert explicit == cfg and explicit.config_hash() == h


def test_new_latency_keys_round_trip_and_change_the_hash():
    for d in ({"latency": {"model": "linear", "a": 0.004, "b": 1e-5, "e": 3e-10}},
              {"latency": {"model": "linear", "a": 0.004, "e": 3e-10, "request_overhead_s": 0.0067}},
              {"latency": {"request_overhead_s": 0.0067}},
              {"latency": {"model": "calibrated", "cpu_overhead_s": 0, "request_overhead_s": 1}}):
        cfg = engine_config_from_dict(d)
        dd = cfg.to_dict()
        for key, v in d["latency"].items():
            assert dd["latency"][key] == v
        back = engine_config_from_dict(json.loads(json.dumps(dd, allow_nan=False)))
        assert back == cfg and back.to_dict() == dd and back.config_hash() == cfg.config_hash()
        without = {k: v for k, v in d["latency"].items() if k not in ("e", "request_overhead_s")}
        if d["latency"].get("model") == "linear" and "a" not in without:
            without["a"] = 0.004
        assert engine_config_from_dict({"latency": without}).config_hash() != cfg.config_hash()
    cfg = engine_config_from_dict({"latency": {"request_overhead_s": 2}})
    assert cfg.request_overhead_s == 2.0 and isinstance(cfg.request_overhead_s, float)
    assert EngineConfig().request_overhead_s == 0.0
    assert EngineConfig(request_overhead_s=0.25).to_dict()["latency"]["request_overhead_s"] == 0.25


# --------------------------------------------------------------------------- errors
BAD = [
    ({"engine": {"max_num_seqs": -3}}, "engine.toml: [engine] max_num_seqs: must be a positive integer, got -3"),
    ({"engine": {"max_num_seqs": 2.0}}, "engine.toml: [engine] max_num_seqs: must be a positive integer, got 2.0"),
    ({"engine": {"max_num_seqs": True}}, "engine.toml: [engine] max_num_seqs: must be a positive integer, got true"),
    ({"engine": {"max_num_seqs": "8"}}, 'engine.toml: [engine] max_num_seqs: must be a positive integer, got "8"'),
    ({"engine": {"block_size": 0}}, "engine.toml: [engine] block_size: must be a positive integer, got 0"),
    ({"engine": {"block_size": 24}}, "engine.toml: [engine] block_size: must be a power of two, got 24"),
    ({"engine": {"gpu_memory_utilization": 0}}, "[engine] gpu_memory_utilization: must be a number in (0, 1], got 0"),
    ({"engine": {"gpu_memory_utilization": 1.01}}, "gpu_memory_utilization: must be a number in (0, 1], got 1.01"),
    ({"engine": {"gpu_memory_gib": -80}}, "[engine] gpu_memory_gib: must be a positive number, got -80"),
    ({"engine": {"gpu_memory_gib": float("inf")}}, "[engine] gpu_memory_gib: must be a positive number, got inf"),
    ({"engine": {"activation_reserve_gib": -1}}, "[engine] activation_reserve_gib: must be a number >= 0, got -1"),
    ({"engine": {"watermark": 0.5}}, "[engine] watermark: must be a fraction in [0, 0.5), got 0.5"),
    ({"engine": {"watermark": -0.01}}, "[engine] watermark: must be a fraction in [0, 0.5), got -0.01"),
    ({"engine": {"max_num_batched_tokens": 0}}, "[engine] max_num_batched_tokens: must be a positive integer, got 0"),
    ({"engine": {"num_gpu_blocks": 511}},
     "[engine] num_gpu_blocks: must hold one max_model_len request (ceil(8192 / 16) = 512 blocks plus the "
     "null block), got 511"),
    ({"engine": {"num_gpu_blocks": 512}}, "= 512 blocks plus the null block), got 512"),
    ({"engine": {"num_gpu_blocks": 511, "null_block": False}}, "(ceil(8192 / 16) = 512 blocks), got 511"),
    ({"engine": {"null_block": 1}}, "[engine] null_block: must be true or false, got 1"),
    ({"engine": {"reserve_full_prompt": "yes"}}, '[engine] reserve_full_prompt: must be true or false, got "yes"'),
    ({"engine": {"priority_victim_ties": "random"}},
     '[engine] priority_victim_ties: must be "first-running" or "last-index", got "random"'),
    ({"engine": {"over_length": "truncate"}}, '[engine] over_length: must be "reject" or "clamp", got "truncate"'),
    ({"engine": {"swap_space_gib": -1}}, "[engine] swap_space_gib: must be a number >= 0 (GiB of host memory), got -1"),
    ({"engine": {"swap_space_gib": True}}, "[engine] swap_space_gib: must be a number >= 0 (GiB of host memory), got true"),
    ({"engine": {"pcie_gb_s": 0}}, "[engine] pcie_gb_s: must be a number > 0 (GB/s), got 0"),
    ({"engine": {"gpu_memory_gib": 18.5}}, "[engine] num_gpu_blocks (derived from the memory keys): must hold one"),
    ({"engine": {"gpu_memory_gib": 16}}, "[engine] num_gpu_blocks (derived): gpu_memory_gib x gpu_memory_utilization"),
    ({"engine": {"num_layers": 40}}, '[engine] num_layers: the calibrated latency model describes Llama-3-8B'),
    ({"engine": {"foo": 1}}, "engine.toml: [engine] unknown key 'foo'; known keys: block_size, num_gpu_blocks"),
    ({"latency": {"modle": "linear"}}, "engine.toml: [latency] unknown key 'modle'; known keys: model, cpu_overhead_s"),
    ({"latency": {"model": "fast"}}, 'engine.toml: [latency] model: must be "calibrated" or "linear", got "fast"'),
    ({"latency": {"a": 0.01}}, 'engine.toml: [latency] key \'a\' only applies to model = "linear"'),
    ({"latency": {"model": "linear", "lm_head": False}}, "[latency] key 'lm_head' only applies to model = \"calibrated\""),
    ({"latency": {"model": "linear", "a": 0}}, "[latency] a: must be a number > 0 (seconds per iteration), got 0"),
    ({"latency": {"model": "linear", "a": 1, "c": -1}}, "[latency] c: must be a number >= 0"),
    ({"latency": {"lm_head": 1}}, "engine.toml: [latency] lm_head: must be true or false, got 1"),
    ({"latency": {"cpu_overhead_s": -0.001}}, "[latency] cpu_overhead_s: must be a number >= 0 (seconds), got -0.001"),
    ({"latency": {"model": "linear", "a": 1, "e": -1e-9}},
     "engine.toml: [latency] e: must be a number >= 0 (seconds per prefill attention token pair), got -1e-09"),
    ({"latency": {"model": "linear", "a": 1, "e": float("nan")}},
     "[latency] e: must be a number >= 0 (seconds per prefill attention token pair), got nan"),
    ({"latency": {"model": "linear", "a": 1, "e": "0"}}, '[latency] e: must be a number >= 0 (seconds per prefill'),
    ({"latency": {"model": "linear", "e": 1e-9}}, "[latency] a: must be a number > 0 (seconds per iteration), got 0.0"),
    ({"latency": {"e": 1e-9}}, 'engine.toml: [latency] key \'e\' only applies to model = "linear" (model is "calibrated")'),
    ({"latency": {"model": "linear", "a": 1, "e": None}}, "engine.toml: [latency] e: must not be empty, got None"),
    ({"latency": {"request_overhead_s": -0.001}},
     "engine.toml: [latency] request_overhead_s: must be a number >= 0 (seconds per request), got -0.001"),
    ({"latency": {"model": "linear", "request_overhead_s": float("inf")}},
     "engine.toml: [latency] request_overhead_s: must be a number >= 0 (seconds per request), got inf"),
    ({"latency": {"request_overhead_s": True}},
     "engine.toml: [latency] request_overhead_s: must be a number >= 0 (seconds per request), got true"),
    ({"latency": {"request_overhead_s": "10ms"}},
     'engine.toml: [latency] request_overhead_s: must be a number >= 0 (seconds per request), got "10ms"'),
    ({"latency": {"request_overhead_s": None}}, "engine.toml: [latency] request_overhead_s: must not be empty"),
    ({"slo": {"Strict": {"ttft_s": 1, "tpot_s": 1}}}, "[slo.Strict]: profile names must match [a-z0-9_]+"),
    ({"slo": {"new": {"ttft_s": 1}}}, "engine.toml: [slo.new] missing key 'tpot_s'"),
    ({"slo": {"strict": {"ttft_s": 0}}}, "engine.toml: [slo.strict] ttft_s: must be a number > 0 (seconds), got 0"),
    ({"slo": {"strict": {"tpot": 0.1}}}, "engine.toml: [slo.strict] unknown key 'tpot'; known keys: ttft_s, tpot_s"),
    ({"slo": {"strict": 3}}, "engine.toml: [slo] strict: must be a table"),
    ({"metrics": {"horizon_factor": 0}}, "engine.toml: [metrics] horizon_factor: must be a number > 0, got 0"),
    ({"metrics": {"horizon": 2}}, "engine.toml: [metrics] unknown key 'horizon'; known keys: horizon_factor"),
    ({"scheduler": {"vtc": 1}}, "engine.toml: [scheduler] vtc: must be a table [scheduler.vtc], got 1"),
    ({"engines": {}}, "engine.toml: unknown section [engines]; known sections: engine, latency, slo, metrics, scheduler"),
    ({"block_size": 16}, "engine.toml: unknown top-level key 'block_size' (keys belong in a section)"),
    ({"engine": 3}, "engine.toml: [engine] must be a table, got 3"),
]


@pytest.mark.parametrize("d,msg", BAD, ids=[m[:60] for _, m in BAD])
def test_bad_values_give_one_line_errors(d, msg):
    with pytest.raises(ConfigError) as ei:
        engine_config_from_dict(d, source="engine.toml")
    text = str(ei.value)
    assert msg in text
    assert text.startswith("engine.toml: ")
    assert "\n" not in text


def test_malformed_toml_names_file_line_and_column(tmp_path):
    p = write(tmp_path, "[engine]\nblock_size = 16\nmax_num_seqs == 3\n")
    with pytest.raises(ConfigError) as ei:
        load_engine_config(p)
    text = str(ei.value)
    assert text.startswith(f"{p}: invalid TOML: ") and "line 3" in text and "column" in text
    assert "\n" not in text


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read engine config"):
        load_engine_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="cannot read engine config"):
        load_engine_config(tmp_path)  # a directory
    p = tmp_path / "bin.toml"
    p.write_bytes(b"[engine]\nblock_size = \xff\n")
    with pytest.raises(ConfigError, match=r"bin\.toml: invalid TOML"):
        load_engine_config(p)


def test_file_errors_name_the_file(tmp_path):
    p = write(tmp_path, "[engine]\nmax_num_seqs = -3\n")
    with pytest.raises(ConfigError) as ei:
        load_engine_config(p)
    assert str(ei.value) == f"{p}: [engine] max_num_seqs: must be a positive integer, got -3"


def test_scheduler_params_must_be_json_values(tmp_path):
    p = write(tmp_path, "[scheduler.edf]\nstart = 1979-05-27\n")
    with pytest.raises(ConfigError, match=r"\[scheduler\.edf\]\.start: must be a number, string, boolean"):
        load_engine_config(p)
