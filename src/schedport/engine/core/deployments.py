"""Deployment profiles: a model on a GPU at a tensor-parallel degree, as a named engine config.

The study's engine is one deployment, Llama-3-8B on one A100-80GB (`CalibratedLatency`). A
*deployment profile* is another one, built the same way:

* **shape and memory** -- the model's layers, heads, head dim, dtype and parameters, the GPU's
  memory and the TP degree: the ``[engine]`` keys that the KV arithmetic of docs/engine.md §2
  turns into KV blocks (`engine_overlay`);
* **latency** -- the coefficients of `CalibratedLatency`'s form, the non-attention part fit to
  Vidur's measured per-operator profile of that model on that GPU at that TP degree (plus the
  measured all-reduce for TP > 1), attention from the GPU's data-sheet bandwidth and compute
  with the efficiencies of the A100 fit (`schedport.engine.core.profilefit` builds them);
* **labels** -- every coefficient marked measured, fit or assumed, and the fit errors against
  the profile.

The fitted coefficients are embedded in ``engine/core/data/deployments.json`` (written by
``tools/fit_deployments.py`` from ``../shared/calibration/vidur-profiles``, checked against a
fresh fit by the tests), so running a deployment needs no data files. ``[latency] deployment =
NAME`` selects one (docs/engine.md §3.7).

There is no public H100 profile for Llama-3-8B (Vidur publishes none), so there is no
``llama3-8b-h100`` here: the study's own model is profiled on the A100 only.

One deployment is the study's own calibration at a longer context: ``llama3.1-8b-a100-128k``,
Llama-3.1-8B (Llama-3-8B's shape, a 131,072-token context) on one A100-80GB. Its latency is the
A100 calibration of docs/engine.md §3.1 unchanged (``"latency": "calibrated"`` in its spec, not
fit from a profile, not in deployments.json) and its ``[engine]`` keys add ``max_model_len``, so
long-prompt traces (Mooncake's, up to 126,195 prompt tokens) run without dropping requests.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from schedport.errors import ConfigError

__all__ = ["GPUS", "MODELS", "DEPLOYMENT_SPECS", "deployment_names", "fitted_names", "deployment", "engine_overlay",
           "model_shape", "latency_inputs", "describe_latency"]

#: GPUs with their data-sheet figures (what the attention bounds use) and where they come from.
GPUS: dict[str, dict] = {
    "a100": {
        "label": "A100-80GB SXM",
        "memory_gib": 80.0,
        "memory_note": "nominal 80 GiB, as the study's default (docs/engine.md §2)",
        "hbm_bytes_per_s": 2.039e12,
        "bf16_dense_flops": 312e12,
        "datasheet": "NVIDIA A100 Tensor Core GPU data sheet (A100 80GB SXM: 2,039 GB/s HBM2e, "
                     "312 TFLOPS BF16 Tensor Core dense, 624 with sparsity)",
    },
    "h100": {
        "label": "H100 SXM5 80GB",
        "memory_gib": 80.0,
        "memory_note": "nominal 80 GiB, as for the A100 (assumed)",
        "hbm_bytes_per_s": 3.35e12,
        "bf16_dense_flops": 989.4e12,
        "datasheet": "NVIDIA H100 Tensor Core GPU data sheet (H100 SXM: 3.35 TB/s HBM3, "
                     "1,979 TFLOPS BF16 Tensor Core with sparsity, i.e. 989.4 dense)",
    },
    "a40": {
        "label": "A40 48GB",
        "memory_gib": 45.0,
        "memory_note": "assumed: the 46,068 MiB nvidia-smi reports for a 48 GB A40 with ECC on, rounded "
                       "down to 45 GiB",
        "hbm_bytes_per_s": 696e9,
        "bf16_dense_flops": 149.7e12,
        "datasheet": "NVIDIA A40 data sheet (48 GB GDDR6 with ECC, 696 GB/s, "
                     "149.7 TFLOPS BF16 Tensor Core dense, 299.4 with sparsity)",
    },
}

#: Model shapes (Hugging Face config.json of each model) and the Vidur profile directory.
MODELS: dict[str, dict] = {
    "llama2-7b": {
        "label": "Llama-2-7B", "profile": "meta-llama/Llama-2-7b-hf",
        "num_layers": 32, "num_q_heads": 32, "num_kv_heads": 32, "head_dim": 128, "hidden": 4096,
        "ffn": 11008, "vocab": 32000, "dtype_bytes": 2, "num_params": 6738415616,
    },
    "llama2-70b": {
        "label": "Llama-2-70B", "profile": "meta-llama/Llama-2-70b-hf",
        "num_layers": 80, "num_q_heads": 64, "num_kv_heads": 8, "head_dim": 128, "hidden": 8192,
        "ffn": 28672, "vocab": 32000, "dtype_bytes": 2, "num_params": 68976648192,
    },
    "llama3-70b": {
        "label": "Llama-3-70B", "profile": "meta-llama/Meta-Llama-3-70B",
        "num_layers": 80, "num_q_heads": 64, "num_kv_heads": 8, "head_dim": 128, "hidden": 8192,
        "ffn": 28672, "vocab": 128256, "dtype_bytes": 2, "num_params": 70553706496,
    },
    # Llama-3.1-8B: config.json as Llama-3-8B's (the study's model), rope scaling aside, with
    # max_position_embeddings 131072; the study's calibration describes its cost.
    "llama3.1-8b": {
        "label": "Llama-3.1-8B", "profile": None,
        "num_layers": 32, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "hidden": 4096,
        "ffn": 14336, "vocab": 128256, "dtype_bytes": 2, "num_params": 8030261248, "max_model_len": 131072,
    },
}

#: The deployments: model, GPU, TP degree and, for TP > 1, the all-reduce topology profiled.
DEPLOYMENT_SPECS: dict[str, dict] = {
    "llama2-7b-a100": {"model": "llama2-7b", "gpu": "a100", "tp": 1, "topology": None},
    "llama2-7b-h100": {"model": "llama2-7b", "gpu": "h100", "tp": 1, "topology": None},
    "llama2-7b-a40": {"model": "llama2-7b", "gpu": "a40", "tp": 1, "topology": None},
    "llama2-70b-a100-tp4": {"model": "llama2-70b", "gpu": "a100", "tp": 4, "topology": "a100_dgx"},
    "llama2-70b-h100-tp4": {"model": "llama2-70b", "gpu": "h100", "tp": 4, "topology": "h100_dgx"},
    "llama3-70b-a100-tp4": {"model": "llama3-70b", "gpu": "a100", "tp": 4, "topology": "a100_dgx"},
    "llama3.1-8b-a100-128k": {"model": "llama3.1-8b", "gpu": "a100", "tp": 1, "topology": None,
                              "latency": "calibrated"},
}


def fitted_names() -> tuple[str, ...]:
    """The deployments fit from Vidur's profiles (what deployments.json embeds); the others use
    the study's own A100 calibration."""
    return tuple(n for n, s in DEPLOYMENT_SPECS.items() if s.get("latency") != "calibrated")


def deployment_names() -> tuple[str, ...]:
    """The names `deployment` accepts, in their shipped order."""
    return tuple(DEPLOYMENT_SPECS)


@lru_cache(maxsize=1)
def _embedded() -> dict:
    raw = (resources.files("schedport.engine.core") / "data" / "deployments.json").read_text(encoding="utf-8")
    return json.loads(raw)["deployments"]


def deployment(name: str) -> dict:
    """The embedded profile of deployment `name`: spec, shape, GPU, coefficients (in
    `CalibratedLatency`'s keys), labels, fit errors and provenance. A one-line `ConfigError`
    names the known deployments for an unknown name."""
    if name not in DEPLOYMENT_SPECS:
        raise ConfigError(f"unknown deployment {name!r}; known deployments: {', '.join(DEPLOYMENT_SPECS)} "
                          "(there is no public H100 profile for Llama-3-8B; docs/engine.md §3.7)")
    if DEPLOYMENT_SPECS[name].get("latency") == "calibrated":
        return _calibrated_profile(name)
    return _embedded()[name]


@lru_cache(maxsize=None)
def _calibrated_profile(name: str) -> dict:
    """The profile of a deployment whose latency is the study's A100 calibration (§3.1): the
    model has the calibrated shape, so the coefficients carry over as they are. ``coeffs`` is
    None: `CalibratedLatency` then uses its own embedded calibration (and its provenance)."""
    spec = DEPLOYMENT_SPECS[name]
    m, gpu = MODELS[spec["model"]], GPUS[spec["gpu"]]
    same = "the A100 calibration of Llama-3-8B (docs/engine.md §3.1), the same shape"
    return {
        "name": name, "model": spec["model"], "model_label": m["label"], "gpu": spec["gpu"],
        "gpu_label": gpu["label"], "tp": spec["tp"], "topology": None,
        "coeffs": None, "labels": same,
        "fit": {"calibration": "docs/engine.md §3.1 (its fit errors hold as stated there)",
                "context": "attention sampled at decode contexts up to 7,424 and prefill histories up to 15,360 "
                           f"tokens; longer contexts, up to {m['max_model_len']:,}, extrapolate its forms (KV bytes "
                           "over bandwidth, FLOPs over an efficiency), both linear in the context"},
        "provenance": {"source": "schedport.engine.core.latency.CALIBRATION_PROVENANCE (the study's calibration)",
                       "datasheet": gpu["datasheet"], "memory": gpu["memory_note"]},
    }


def model_shape(name: str) -> dict[str, int]:
    """The per-GPU shape `CalibratedLatency` needs for deployment `name`: layers, heads, head dim,
    dtype and the TP degree (heads are split over the TP workers)."""
    spec = DEPLOYMENT_SPECS[name]
    m = MODELS[spec["model"]]
    return {"num_layers": m["num_layers"], "num_q_heads": m["num_q_heads"], "num_kv_heads": m["num_kv_heads"],
            "head_dim": m["head_dim"], "dtype_bytes": m["dtype_bytes"], "num_params": m["num_params"],
            "tensor_parallel_size": spec["tp"]}


def engine_overlay(name: str) -> dict:
    """The ``[engine]`` keys of deployment `name` (shape, GPU memory, TP degree): what a variant's
    overlay sets so that the KV arithmetic of docs/engine.md §2 is done for this deployment."""
    spec = DEPLOYMENT_SPECS[name]
    m = MODELS[spec["model"]]
    out = {k: m[k] for k in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "num_params")}
    out["gpu_memory_gib"] = GPUS[spec["gpu"]]["memory_gib"]
    out["tensor_parallel_size"] = spec["tp"]
    if "max_model_len" in m:
        out["max_model_len"] = m["max_model_len"]
    return out


def latency_inputs(name: str, coeffs=None) -> tuple[dict, int, dict]:
    """(shape, TP degree, coefficients) `CalibratedLatency` builds deployment `name` from: the
    profile's own fit unless `coeffs` is given (None for a deployment on the study's calibration:
    `CalibratedLatency` then takes its embedded coefficients)."""
    shape = model_shape(name)
    return shape, shape["tensor_parallel_size"], deployment(name)["coeffs"] if coeffs is None else coeffs


def describe_latency(name: str, cpu_overhead_s: float, lm_head: bool, coeffs: dict) -> dict:
    """`CalibratedLatency.describe` for deployment `name`: hardware, model, coefficients with their
    labels, fit errors and provenance (JSON-able)."""
    prof = deployment(name)
    labels = prof["labels"]
    labels = dict(labels) if isinstance(labels, dict) else dict.fromkeys(coeffs, labels)
    return {"model": "calibrated", "deployment": name, "hardware": f"{prof['gpu_label']}, TP={prof['tp']}",
            "llm": f"{prof['model_label']} (bf16)", "cpu_overhead_s": cpu_overhead_s, "lm_head": lm_head,
            "gqa_batching_factor": 1.0, "coefficients": dict(coeffs),
            "labels": labels,
            "model_shape": model_shape(name), "fit": dict(prof["fit"]), "provenance": dict(prof["provenance"])}
