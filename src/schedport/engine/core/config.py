"""Engine configuration: one TOML file, every key optional, every mistake a one-line error.

```toml
[engine]                      # the simulated vLLM-like engine (one replica, one GPU)
block_size = 16               # tokens per KV block (power of two)
# num_gpu_blocks = 28437      # default: derived from the memory keys below
gpu_memory_gib = 80
gpu_memory_utilization = 0.9
activation_reserve_gib = 1.5
num_layers = 32               # model shape (Llama-3-8B)
num_kv_heads = 8
head_dim = 128
dtype_bytes = 2
num_params = 8030261248
# tensor_parallel_size = 1    # GPUs the model is split over (a deployment's, docs/engine.md §3.7)
# enable_prefix_caching = false  # vLLM's automatic prefix caching (docs/engine.md §1.3)
max_num_seqs = 256
# max_num_batched_tokens = 2048   # default: each batching mode's own
max_model_len = 8192
# watermark = 0.01                # default: each batching mode's own; [0, 0.5)

[latency]
model = "calibrated"          # or "linear"
cpu_overhead_s = 0.002        # calibrated only
lm_head = true                # calibrated only
# deployment = "llama2-7b-h100"  # calibrated only: another model/GPU's profile (docs/engine.md §3.7)
# a = 0.01; b = 0; c = 0; d = 0; e = 0  # linear only (seconds); see docs/engine.md
request_overhead_s = 0.0      # both models: per-request time before the engine queue
prefill_scale = 1.0           # both models: perturbations of the model (docs/engine.md §3.6)
decode_scale = 1.0
attention_scale = 1.0

[slo.strict]                  # override a default profile or add a new one
ttft_s = 0.5
tpot_s = 0.05

[metrics]
horizon_factor = 1.5

[scheduler.sarathi]           # free-form policy parameters, validated by the registry
chunk_size = 512
```

`load_engine_config(path)` reads a file, `engine_config_from_dict(d)` takes the same
structure as a dict; both return a frozen `EngineConfig` whose `to_dict()` is fully
resolved (derived `num_gpu_blocks`, fitted linear coefficients) and round-trips through
`engine_config_from_dict`.  The two later additions ``[latency] e`` and
``request_overhead_s`` appear in `to_dict()` only when non-zero, so every config written
before they existed keeps its `config_hash` (stores and capacity caches are keyed by it),
and writing ``e = 0`` explicitly is the same config as leaving it out.  Constructing
`EngineConfig(...)` directly runs the same validation (errors then name the source
``<EngineConfig>``).  See docs/engine.md for every default and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from schedport.common.values import is_int as _is_int, is_real as _is_real
from schedport.errors import ConfigError
from schedport.engine.core.deployments import deployment_names, engine_overlay
from schedport.engine.core.latency import CALIBRATED_MODEL_SHAPE, DEFAULT_CPU_OVERHEAD_S, LINEAR_DEFAULTS, SCALE_KEYS

__all__ = [
    "EngineConfig",
    "load_engine_config",
    "engine_config_from_dict",
    "DEFAULT_SLO_PROFILES",
    "SECTIONS",
]

GIB = 2**30

#: Default SLO profiles (ttft_s, tpot_s), in this order.
DEFAULT_SLO_PROFILES: dict[str, tuple[float, float]] = {
    "strict": (0.5, 0.05),
    "standard": (2.0, 0.1),
    "relaxed": (10.0, 0.2),
}

# TOML key -> EngineConfig field, per section.
_ENGINE_KEYS = (
    "block_size", "num_gpu_blocks", "gpu_memory_gib", "gpu_memory_utilization",
    "activation_reserve_gib", "num_layers", "num_kv_heads", "head_dim", "dtype_bytes",
    "num_params", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "watermark",
    "reserve_full_prompt", "null_block", "priority_victim_ties", "over_length", "swap_space_gib", "pcie_gb_s",
    "tensor_parallel_size", "enable_prefix_caching",
)
#: `[engine] priority_victim_ties`: which of several equally ranked running requests a priority
#: order preempts first. "first-running" is vLLM v1's `max(running, key=(priority, arrival))`.
_VICTIM_TIES = ("first-running", "last-index")
#: `[engine] over_length`: what happens to a request whose prompt + output exceeds max_model_len.
_OVER_LENGTH = ("reject", "clamp")
_LATENCY_KEYS = {
    "model": "latency_model",
    "cpu_overhead_s": "cpu_overhead_s",
    "lm_head": "lm_head",
    "deployment": "deployment",
    "a": "linear_a",
    "b": "linear_b",
    "c": "linear_c",
    "d": "linear_d",
    "e": "linear_e",
    "f": "linear_f",
    "request_overhead_s": "request_overhead_s",
    "prefill_scale": "prefill_scale",
    "decode_scale": "decode_scale",
    "attention_scale": "attention_scale",
}
_CALIBRATED_ONLY = ("cpu_overhead_s", "lm_head", "deployment")
_LINEAR_ONLY = ("a", "b", "c", "d", "e", "f")
_LATENCY_MODELS = ("calibrated", "linear")
_SLO_KEYS = ("ttft_s", "tpot_s")
_METRICS_KEYS = ("horizon_factor",)
SECTIONS = ("engine", "latency", "slo", "metrics", "scheduler")
_PROFILE_RE = re.compile(r"[a-z0-9_]+")

# EngineConfig field -> (section, key) for error messages.
_FIELD_LOC: dict[str, tuple[str, str]] = {k: ("engine", k) for k in _ENGINE_KEYS}
_FIELD_LOC.update({f: ("latency", k) for k, f in _LATENCY_KEYS.items()})
_FIELD_LOC["horizon_factor"] = ("metrics", "horizon_factor")


def fmt_toml(v: Any) -> str:
    """A value as it would be written in TOML, for error messages that quote a config value
    (the scheduler-table checks of `schedport.engine.policies.schedulers` quote values the same way)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "a table"
    return repr(v)


class _Checker:
    """Raises one-line ConfigErrors that name the source, section, key, value and rule."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, section: str, key: str, rule: str, value: Any = None, show_value: bool = True) -> None:
        msg = f"{self.source}: [{section}] {key}: {rule}"
        if show_value:
            msg += f", got {fmt_toml(value)}"
        raise ConfigError(msg)

    def pos_int(self, fld: str, v: Any) -> int:
        sec, key = _FIELD_LOC[fld]
        if not _is_int(v) or v <= 0:
            self.fail(sec, key, "must be a positive integer", v)
        return int(v)

    def real(self, fld: str, v: Any, rule: str, ok) -> float:
        sec, key = _FIELD_LOC[fld]
        if not _is_real(v) or not math.isfinite(float(v)) or not ok(float(v)):
            self.fail(sec, key, rule, v)
        return float(v)


@dataclass(frozen=True)
class EngineConfig:
    """A validated, fully resolved engine configuration (immutable).

    Build it with `load_engine_config` / `engine_config_from_dict`, or directly; ``None``
    in `num_gpu_blocks`, the linear coefficients, `cpu_overhead_s`, `lm_head` and
    `request_overhead_s` means "not given" and is resolved in ``__post_init__`` (derived
    blocks, fitted or zero coefficients, documented defaults).  Note that
    `dataclasses.replace` keeps the resolved `num_gpu_blocks` as given: to change the
    memory keys, build a new config.
    """

    # [engine]
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_gib: float = 80.0
    gpu_memory_utilization: float = 0.9
    activation_reserve_gib: float = 1.5
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    num_params: int = 8030261248
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 8192
    watermark: float | None = None
    reserve_full_prompt: bool = True
    null_block: bool = True
    priority_victim_ties: str = "first-running"
    over_length: str = "reject"
    swap_space_gib: float = 16.0
    pcie_gb_s: float = 25.0
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = False
    # [latency]
    latency_model: str = "calibrated"
    cpu_overhead_s: float | None = None
    lm_head: bool | None = None
    deployment: str | None = None
    linear_a: float | None = None
    linear_b: float | None = None
    linear_c: float | None = None
    linear_d: float | None = None
    linear_e: float | None = None
    linear_f: float | None = None
    request_overhead_s: float | None = None
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    attention_scale: float = 1.0
    # [slo.*], [metrics], [scheduler.*]
    slo_profiles: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_SLO_PROFILES))
    horizon_factor: float = 1.5
    scheduler_params: dict[str, dict] = field(default_factory=dict)
    # where it came from (not part of the configuration's identity)
    source: str = field(default="<EngineConfig>", compare=False)
    num_gpu_blocks_derived: bool = field(default=False, init=False, compare=False)

    # -- validation and resolution --------------------------------------------------------
    def __post_init__(self) -> None:
        chk = _Checker(self.source)
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731

        for name in ("block_size", "num_layers", "num_kv_heads", "head_dim", "dtype_bytes",
                     "num_params", "max_num_seqs", "max_model_len", "tensor_parallel_size"):
            put(name, chk.pos_int(name, getattr(self, name)))
        if self.block_size & (self.block_size - 1):
            chk.fail("engine", "block_size", "must be a power of two", self.block_size)
        if self.max_num_batched_tokens is not None:
            put("max_num_batched_tokens", chk.pos_int("max_num_batched_tokens", self.max_num_batched_tokens))
        put("gpu_memory_gib", chk.real("gpu_memory_gib", self.gpu_memory_gib, "must be a positive number",
                                       lambda x: x > 0))
        put("gpu_memory_utilization", chk.real("gpu_memory_utilization", self.gpu_memory_utilization,
                                               "must be a number in (0, 1]", lambda x: 0 < x <= 1))
        put("activation_reserve_gib", chk.real("activation_reserve_gib", self.activation_reserve_gib,
                                               "must be a number >= 0", lambda x: x >= 0))
        if self.watermark is not None:
            put("watermark", chk.real("watermark", self.watermark, "must be a fraction in [0, 0.5)",
                                      lambda x: 0 <= x < 0.5))
        for name in ("reserve_full_prompt", "null_block", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                chk.fail("engine", name, "must be true or false", getattr(self, name))
        if self.priority_victim_ties not in _VICTIM_TIES:
            chk.fail("engine", "priority_victim_ties", 'must be "first-running" or "last-index"',
                     self.priority_victim_ties)
        if self.over_length not in _OVER_LENGTH:
            chk.fail("engine", "over_length", 'must be "reject" or "clamp"', self.over_length)
        put("swap_space_gib", chk.real("swap_space_gib", self.swap_space_gib,
                                       "must be a number >= 0 (GiB of host memory)", lambda x: x >= 0))
        put("pcie_gb_s", chk.real("pcie_gb_s", self.pcie_gb_s, "must be a number > 0 (GB/s)", lambda x: x > 0))
        put("horizon_factor", chk.real("horizon_factor", self.horizon_factor, "must be a number > 0",
                                       lambda x: x > 0))

        # KV capacity.
        need = -(-self.max_model_len // self.block_size)
        if self.num_gpu_blocks is None:
            blocks, pool = self._derive_blocks()
            if blocks <= 0:
                chk.fail("engine", "num_gpu_blocks (derived)",
                         f"gpu_memory_gib x gpu_memory_utilization - weights (num_params x dtype_bytes) - "
                         f"activation_reserve_gib must leave at least one {self.block_bytes}-byte block, "
                         f"got {blocks} blocks ({pool} bytes left)", show_value=False)
            if blocks - self.null_block < need:
                chk.fail("engine", "num_gpu_blocks (derived from the memory keys)",
                         f"must hold one max_model_len request (ceil({self.max_model_len} / "
                         f"{self.block_size}) = {need} blocks{_null_note(self.null_block)})", blocks)
            put("num_gpu_blocks", blocks)
            put("num_gpu_blocks_derived", True)
        else:
            put("num_gpu_blocks", chk.pos_int("num_gpu_blocks", self.num_gpu_blocks))
            if self.num_gpu_blocks - self.null_block < need:
                chk.fail("engine", "num_gpu_blocks",
                         f"must hold one max_model_len request (ceil({self.max_model_len} / "
                         f"{self.block_size}) = {need} blocks{_null_note(self.null_block)})", self.num_gpu_blocks)

        self._resolve_latency(chk, put)
        put("slo_profiles", self._check_slo(chk, self.slo_profiles))
        put("scheduler_params", _check_scheduler_params(chk, self.scheduler_params))

    def _derive_blocks(self) -> tuple[int, int]:
        """(blocks, pool bytes): floor((mem x util - weights - reserve) / block bytes), exact."""
        tp = self.tensor_parallel_size      # every GPU of a TP group holds its share of both
        usable = Fraction(repr(self.gpu_memory_gib)) * GIB * Fraction(repr(self.gpu_memory_utilization))
        budget = tp * math.floor(usable)
        reserve = tp * math.floor(Fraction(repr(self.activation_reserve_gib)) * GIB)
        pool = budget - self.weights_bytes - reserve
        return (pool // self.block_bytes if pool > 0 else 0), pool

    def _resolve_latency(self, chk: _Checker, put) -> None:
        model = self.latency_model
        if model not in _LATENCY_MODELS:
            chk.fail("latency", "model", 'must be "calibrated" or "linear"', model)
        given = {k: getattr(self, _LATENCY_KEYS[k]) for k in _CALIBRATED_ONLY + _LINEAR_ONLY}
        wrong = _LINEAR_ONLY if model == "calibrated" else _CALIBRATED_ONLY
        other = "linear" if model == "calibrated" else "calibrated"
        for key in wrong:
            if given[key] is not None:
                raise ConfigError(f'{self.source}: [latency] key {key!r} only applies to model = "{other}" '
                                  f'(model is "{model}")')
        if model == "calibrated":
            cpu = DEFAULT_CPU_OVERHEAD_S if self.cpu_overhead_s is None else self.cpu_overhead_s
            put("cpu_overhead_s", chk.real("cpu_overhead_s", cpu, "must be a number >= 0 (seconds)",
                                           lambda x: x >= 0))
            lm = True if self.lm_head is None else self.lm_head
            if not isinstance(lm, bool):
                chk.fail("latency", "lm_head", "must be true or false", lm)
            put("lm_head", lm)
            if self.deployment is None:
                shape = {**CALIBRATED_MODEL_SHAPE, "tensor_parallel_size": 1}
                what = "describes Llama-3-8B"
            else:
                if not isinstance(self.deployment, str) or self.deployment not in deployment_names():
                    chk.fail("latency", "deployment", f"must be one of {', '.join(deployment_names())} "
                             "(docs/engine.md §3.7; there is no public H100 profile for Llama-3-8B)", self.deployment)
                shape = engine_overlay(self.deployment)
                what = f"of deployment {self.deployment!r} has"
            for name, value in shape.items():
                if name in _ENGINE_KEYS and name != "gpu_memory_gib" and getattr(self, name) != value:
                    chk.fail("engine", name,
                             f"the calibrated latency model {what} {name} = {value}; "
                             'set [latency] model = "linear" to simulate another model shape, or name a '
                             "[latency] deployment with its [engine] keys (docs/engine.md §3.7)", getattr(self, name))
        else:
            coeffs = [given[k] for k in _LINEAR_ONLY]
            if all(v is None for v in coeffs):
                # The fitted defaults are a four-term fit: their e is 0.
                coeffs = [LINEAR_DEFAULTS.get(k, 0.0) for k in _LINEAR_ONLY]
            else:
                coeffs = [0.0 if v is None else v for v in coeffs]
            a, b, c, d, e, f = coeffs
            put("linear_a", chk.real("linear_a", a, "must be a number > 0 (seconds per iteration)",
                                     lambda x: x > 0))
            put("linear_b", chk.real("linear_b", b, "must be a number >= 0 (seconds per prefill token)",
                                     lambda x: x >= 0))
            put("linear_c", chk.real("linear_c", c, "must be a number >= 0 (seconds per decoding sequence)",
                                     lambda x: x >= 0))
            put("linear_d", chk.real("linear_d", d, "must be a number >= 0 (seconds per KV token read)",
                                     lambda x: x >= 0))
            # + 0.0 turns a given -0.0 into 0.0, which to_dict leaves out like any zero.
            put("linear_e", chk.real("linear_e", e, "must be a number >= 0 (seconds per prefill attention "
                                     "token pair)", lambda x: x >= 0) + 0.0)
            put("linear_f", chk.real("linear_f", f, "must be a number >= 0 (extra seconds per prefill token "
                                     "in a step that also decodes)", lambda x: x >= 0) + 0.0)
        for name in SCALE_KEYS:
            put(name, chk.real(name, getattr(self, name), "must be a number > 0 (a factor on the model's cost; "
                               "1 is the model itself)", lambda x: x > 0))
        ro = 0.0 if self.request_overhead_s is None else self.request_overhead_s
        put("request_overhead_s", chk.real("request_overhead_s", ro, "must be a number >= 0 (seconds per request)",
                                           lambda x: x >= 0) + 0.0)

    @staticmethod
    def _check_slo(chk: _Checker, profiles: Any) -> dict[str, tuple[float, float]]:
        if not isinstance(profiles, dict):
            raise ConfigError(f"{chk.source}: [slo] must map profile names to (ttft_s, tpot_s), "
                              f"got {fmt_toml(profiles)}")
        out: dict[str, tuple[float, float]] = {}
        for name, pair in profiles.items():
            if not isinstance(name, str) or not _PROFILE_RE.fullmatch(name):
                raise ConfigError(f"{chk.source}: [slo.{name}]: profile names must match [a-z0-9_]+, "
                                  f"got {fmt_toml(name)}")
            try:
                ttft, tpot = pair
            except (TypeError, ValueError):
                raise ConfigError(f"{chk.source}: [slo.{name}]: must be a pair (ttft_s, tpot_s), "
                                  f"got {fmt_toml(pair)}") from None
            vals = []
            for key, v in (("ttft_s", ttft), ("tpot_s", tpot)):
                if not _is_real(v) or not math.isfinite(float(v)) or not float(v) > 0:
                    chk.fail(f"slo.{name}", key, "must be a number > 0 (seconds)", v)
                vals.append(float(v))
            out[name] = (vals[0], vals[1])
        return out

    # -- derived quantities ---------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: 2 (K, V) x layers x kv heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block (block_size tokens)."""
        return self.block_size * self.kv_bytes_per_token

    @property
    def weights_bytes(self) -> int:
        """Model weights in bytes (num_params x dtype_bytes)."""
        return self.num_params * self.dtype_bytes

    @property
    def usable_gpu_blocks(self) -> int:
        """Blocks requests can hold: num_gpu_blocks less vLLM v1's null block when `null_block`."""
        return self.num_gpu_blocks - self.null_block

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds (num_gpu_blocks x block_size)."""
        return self.num_gpu_blocks * self.block_size

    def memory_breakdown(self) -> dict[str, int]:
        """The KV-capacity arithmetic step by step, in bytes (see docs/engine.md)."""
        tp = self.tensor_parallel_size
        usable = Fraction(repr(self.gpu_memory_gib)) * GIB * Fraction(repr(self.gpu_memory_utilization))
        budget = tp * math.floor(usable)
        reserve = tp * math.floor(Fraction(repr(self.activation_reserve_gib)) * GIB)
        blocks, pool = self._derive_blocks()
        return {"budget_bytes": budget, "weights_bytes": self.weights_bytes, "activation_reserve_bytes": reserve,
                "kv_pool_bytes": pool, "block_bytes": self.block_bytes, "derived_num_gpu_blocks": blocks,
                "num_gpu_blocks": self.num_gpu_blocks}

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able dict in the TOML's structure, fully resolved (including the derived
        num_gpu_blocks and the linear coefficients); `engine_config_from_dict` accepts it back.

        ``[latency] e``, ``f`` and ``request_overhead_s`` are written only when non-zero, and the
        scales (``prefill_scale``, ``decode_scale``, ``attention_scale``) only when not 1: that is
        their resolved default, and leaving them out keeps the dict, and so `config_hash`,
        of every config that does not use them exactly what it was before they existed."""
        engine = {k: getattr(self, k) for k in _ENGINE_KEYS}
        if self.tensor_parallel_size == 1:      # written only when not 1: every older config keeps its hash
            del engine["tensor_parallel_size"]
        if not self.enable_prefix_caching:      # likewise: written only when on
            del engine["enable_prefix_caching"]
        if self.latency_model == "calibrated":
            latency = {"model": "calibrated", "cpu_overhead_s": self.cpu_overhead_s, "lm_head": self.lm_head}
            if self.deployment is not None:     # written only when set, for the same reason
                latency["deployment"] = self.deployment
        else:
            latency = {"model": "linear", "a": self.linear_a, "b": self.linear_b, "c": self.linear_c,
                       "d": self.linear_d}
            if self.linear_e != 0.0:
                latency["e"] = self.linear_e
            if self.linear_f != 0.0:
                latency["f"] = self.linear_f
        if self.request_overhead_s != 0.0:
            latency["request_overhead_s"] = self.request_overhead_s
        for name in SCALE_KEYS:    # 1 is the model itself: written only when it perturbs
            if getattr(self, name) != 1.0:
                latency[name] = getattr(self, name)
        return {
            "engine": engine,
            "latency": latency,
            "slo": {n: {"ttft_s": t, "tpot_s": p} for n, (t, p) in self.slo_profiles.items()},
            "metrics": {"horizon_factor": self.horizon_factor},
            "scheduler": json.loads(json.dumps(self.scheduler_params)),
        }

    def config_hash(self) -> str:
        """sha256 hex of the canonical JSON (sorted keys, no spaces) of `to_dict()`."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def __hash__(self) -> int:
        return hash(self.config_hash())


def _null_note(null_block: bool) -> str:
    return " plus the null block" if null_block else ""


def _check_json_value(chk: _Checker, where: str, v: Any) -> Any:
    if isinstance(v, (str, bool)) or v is None:
        return v
    if _is_int(v):
        return int(v)
    if _is_real(v):
        if not math.isfinite(float(v)):
            raise ConfigError(f"{chk.source}: {where}: must be a finite number, got {fmt_toml(v)}")
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_check_json_value(chk, f"{where}[{i}]", x) for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {str(k): _check_json_value(chk, f"{where}.{k}", x) for k, x in v.items()}
    raise ConfigError(f"{chk.source}: {where}: must be a number, string, boolean, array or table, "
                      f"got {type(v).__name__} {v!r}")


def _check_scheduler_params(chk: _Checker, params: Any) -> dict[str, dict]:
    if not isinstance(params, dict):
        raise ConfigError(f"{chk.source}: [scheduler] must be a table of [scheduler.<name>] tables")
    out: dict[str, dict] = {}
    for name, table in params.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{chk.source}: [scheduler] {name}: must be a table [scheduler.{name}], "
                              f"got {fmt_toml(table)}")
        out[str(name)] = _check_json_value(chk, f"[scheduler.{name}]", table)
    return out


def _table(chk: _Checker, d: dict, section: str) -> dict:
    t = d.get(section, {})
    if not isinstance(t, dict):
        raise ConfigError(f"{chk.source}: [{section}] must be a table, got {fmt_toml(t)}")
    return t


def _unknown_key(chk: _Checker, section: str, key: str, known) -> None:
    raise ConfigError(f"{chk.source}: [{section}] unknown key {key!r}; known keys: {', '.join(known)}")


def engine_config_from_dict(d: dict, source: str = "<dict>") -> EngineConfig:
    """Validate a dict shaped like the TOML file (sections -> tables) into an EngineConfig.

    ``source`` names the origin in error messages (the file path for `load_engine_config`).
    ``None`` is accepted for ``max_num_batched_tokens``, ``watermark`` and
    ``num_gpu_blocks`` (meaning "use the default"), so `EngineConfig.to_dict` round-trips.
    """
    chk = _Checker(source)
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: engine config must be a table of sections, got {type(d).__name__}")
    for sec in d:
        if sec not in SECTIONS:
            if isinstance(d[sec], dict):
                raise ConfigError(f"{source}: unknown section [{sec}]; known sections: {', '.join(SECTIONS)}")
            raise ConfigError(f"{source}: unknown top-level key {sec!r} (keys belong in a section); "
                              f"known sections: {', '.join(SECTIONS)}")
    kw: dict[str, Any] = {"source": source}

    engine = _table(chk, d, "engine")
    for key, v in engine.items():
        if key not in _ENGINE_KEYS:
            _unknown_key(chk, "engine", key, _ENGINE_KEYS)
        if v is None and key not in ("max_num_batched_tokens", "watermark", "num_gpu_blocks"):
            chk.fail("engine", key, "must not be empty", v)
        if v is not None:
            kw[key] = v

    latency = _table(chk, d, "latency")
    for key, v in latency.items():
        if key not in _LATENCY_KEYS:
            _unknown_key(chk, "latency", key, tuple(_LATENCY_KEYS))
    model = latency.get("model", "calibrated")
    if not isinstance(model, str) or model not in _LATENCY_MODELS:
        chk.fail("latency", "model", 'must be "calibrated" or "linear"', model)
    for key, v in latency.items():
        if key == "model":
            continue
        if (model == "calibrated" and key in _LINEAR_ONLY) or (model == "linear" and key in _CALIBRATED_ONLY):
            other = "linear" if model == "calibrated" else "calibrated"
            raise ConfigError(f'{source}: [latency] key {key!r} only applies to model = "{other}" '
                              f'(model is "{model}")')
        if v is None:
            chk.fail("latency", key, "must not be empty", v)
        kw[_LATENCY_KEYS[key]] = v
    kw["latency_model"] = model

    slo = _table(chk, d, "slo")
    profiles = dict(DEFAULT_SLO_PROFILES)
    for name, table in slo.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [slo] {name}: must be a table [slo.{name}] with ttft_s and tpot_s, "
                              f"got {fmt_toml(table)}")
        if not isinstance(name, str) or not _PROFILE_RE.fullmatch(name):
            raise ConfigError(f"{source}: [slo.{name}]: profile names must match [a-z0-9_]+, got {fmt_toml(name)}")
        for key in table:
            if key not in _SLO_KEYS:
                _unknown_key(chk, f"slo.{name}", key, _SLO_KEYS)
        if name in profiles:
            base = dict(zip(_SLO_KEYS, profiles[name]))
        else:
            missing = [k for k in _SLO_KEYS if k not in table]
            if missing:
                raise ConfigError(f"{source}: [slo.{name}] missing key {missing[0]!r} "
                                  "(a new profile needs both ttft_s and tpot_s)")
            base = {}
        base.update(table)
        profiles[name] = (base["ttft_s"], base["tpot_s"])
    kw["slo_profiles"] = profiles

    metrics = _table(chk, d, "metrics")
    for key, v in metrics.items():
        if key not in _METRICS_KEYS:
            _unknown_key(chk, "metrics", key, _METRICS_KEYS)
        kw[key] = v

    kw["scheduler_params"] = _table(chk, d, "scheduler")
    return EngineConfig(**kw)


def load_engine_config(path: str | Path | None = None) -> EngineConfig:
    """Read an engine-config TOML file (``None``: all defaults).

    Every error -- unreadable file, malformed TOML (with tomllib's line and column),
    unknown section or key, wrong type, impossible value -- is a one-line `ConfigError`
    naming the file.
    """
    if path is None:
        return EngineConfig(source="<defaults>")
    src = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{src}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{src}: invalid TOML: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{src}: cannot read engine config: {e.strerror or e}") from None
    return engine_config_from_dict(data, source=src)

