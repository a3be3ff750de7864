"""Engine variants: the simulator as an axis of the study.

A simulator is a measurement with an error. A *variant* is an overlay of the study's engine config
(a perturbation of the latency model, the CPU overhead, the KV budget, or another deployment)
with a name and a one-line reason; a *variant set* is a named, versioned list of them, shipped
with the package (`SHIPPED`: ``uncertainty``, ``deployments``, ``deployments-scaled``) or written by a
user as TOML::

    schema = 1
    name = "my-set"
    version = 1
    description = "what the set stands for"

    [variants.decode-up]
    why = "decode 10% dearer"
    overlay = { latency = { decode_scale = 1.1 } }

`schedport run --variants NAME|FILE` runs the same matrix once per variant (`run_variant_sweeps`):
the default variant is the plain study, in ``OUT/`` itself, its cells reused and never re-run;
each other variant is a results store of its own in ``OUT/variants/<name>/``, with its capacity
measured on its own engine so that rho means the same load; ``OUT/variants/set.json`` records
the set. `read_variant_runs` reads them back as one table with a ``variant`` column. Every store
is resumable, deterministic and the same on Ray, as any sweep.

An overlay may change the ``[engine]`` and ``[latency]`` sections only (the metrics and the SLO
profiles are the study's). A set's ``slo`` key says how its variants hold the SLO thresholds:
``"absolute"`` (the default: the study's) or ``"scaled"`` to each variant's unloaded latency
(`scaled_slo_profiles`), the choice that decides the SLO metrics' portability across deployments
(``deployments`` and ``deployments-scaled``, docs/engine.md §3.7). A variant that resolves to the
default config, or to another variant's, is refused, and so is an overlay key the engine config
does not know: each a one-line
`SchedportError` naming the set and the variant.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from schedport.engine.core.config import EngineConfig, engine_config_from_dict, load_engine_config
from schedport.errors import ConfigError, SchedportError
from schedport.common.atomic import atomic_write_bytes
from schedport.study.sweep import run_sweep

__all__ = ["DEFAULT_VARIANT", "SHIPPED", "SLO_CHOICES", "scaled_slo_profiles", "Variant", "VariantSet",
           "load_variant_set", "variant_configs",
           "variants_dir", "variant_store", "read_set_record", "write_set_record", "read_variant_runs",
           "run_variant_sweeps", "read_variant_table"]

#: The variant that is the study itself.
DEFAULT_VARIANT = "default"
#: Variant sets shipped with the package: name -> file in ``schedport/study/data``.
SHIPPED = {"uncertainty": "variants-uncertainty.toml", "deployments": "variants-deployments.toml",
           "deployments-scaled": "variants-deployments-scaled.toml"}
#: How a set's variants hold the SLO thresholds: the study's ("absolute") or scaled to each
#: variant's unloaded latency ("scaled", `scaled_slo_profiles`).
SLO_CHOICES = ("absolute", "scaled")
#: The engine-config sections an overlay may change.
OVERLAY_SECTIONS = ("engine", "latency")
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.+-]*")
_SET_KEYS = ("schema", "name", "version", "description", "slo", "slo_reference_tokens", "variants")


@dataclass(frozen=True)
class Variant:
    """One engine variant: its name, its overlay of the engine config and why it is there."""

    name: str
    overlay: dict
    why: str

    def to_dict(self) -> dict:
        """The variant as portability.json and set.json record it."""
        return {"name": self.name, "overlay": copy.deepcopy(self.overlay), "why": self.why}


@dataclass(frozen=True)
class VariantSet:
    """A named, versioned set of engine variants (the default variant is implied)."""

    name: str
    version: int
    description: str
    variants: tuple[Variant, ...]
    source: str
    slo: str = "absolute"
    slo_reference_tokens: int = 1024

    def to_dict(self) -> dict:
        """The set's identity and variants (what a store records and an analysis reports). The SLO
        choice is written only when it is "scaled", so a set that does not scale keeps the record
        (and `digest`) it had before the choice existed."""
        d = {"name": self.name, "version": self.version, "description": self.description,
             "source": self.source, "variants": [v.to_dict() for v in self.variants]}
        if self.slo != "absolute":
            d["slo"] = self.slo
            d["slo_reference_tokens"] = self.slo_reference_tokens
        return d

    def digest(self) -> str:
        """sha256 of the set's name, version and variants: two sets with it equal run the same cells."""
        d = self.to_dict()
        d.pop("source")
        d.pop("description")
        return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_variant_set(spec: str | Path) -> VariantSet:
    """A variant set by its shipped name (`SHIPPED`) or from a TOML file; a one-line
    `SchedportError` for an unknown name, an unreadable file or a malformed set."""
    text = str(spec)
    if text in SHIPPED:
        where = f"variant set {text!r}"
        raw = (resources.files("schedport.study") / "data" / SHIPPED[text]).read_bytes()
        source = f"shipped:{text}"
    else:
        path = Path(text)
        if not (path.suffix == ".toml" or path.exists()):
            raise SchedportError(f"--variants: unknown variant set {text!r}; shipped sets: {', '.join(SHIPPED)} "
                                 f"(or give a TOML file, docs/engine.md §3.6)")
        where = str(path)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise SchedportError(f"{path}: cannot read the variant set ({e.strerror or e})") from None
        source = str(path)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SchedportError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise SchedportError(f"{where}: invalid TOML: {e}") from None
    return _parse_set(data, where, source)


def _parse_set(data: dict, where: str, source: str) -> VariantSet:
    for key in data:
        if key not in _SET_KEYS:
            raise SchedportError(f"{where}: unknown key {key!r}; known keys: {', '.join(_SET_KEYS)}")
    if data.get("schema", 1) != 1:
        raise SchedportError(f"{where}: schema must be 1, got {data.get('schema')!r}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise SchedportError(f"{where}: name must be lower-case letters, digits, '.', '_', '+' or '-', got {name!r}")
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SchedportError(f"{where}: version must be a positive integer, got {version!r}")
    table = data.get("variants")
    if not isinstance(table, dict) or not table:
        raise SchedportError(f"{where}: needs at least one [variants.<name>] table")
    variants = []
    for vname, v in table.items():
        at = f"{where}: variant {vname!r}"
        if not _NAME_RE.fullmatch(vname) or vname == DEFAULT_VARIANT:
            raise SchedportError(f"{at}: a variant's name must be lower-case letters, digits, '.', '_', '+' or '-' "
                                 f"and not {DEFAULT_VARIANT!r} (the study itself)")
        if not isinstance(v, dict):
            raise SchedportError(f"{at}: must be a table with why and overlay")
        for key in v:
            if key not in ("why", "overlay"):
                raise SchedportError(f"{at}: unknown key {key!r}; known keys: why, overlay")
        why = v.get("why")
        if not isinstance(why, str) or not why.strip():
            raise SchedportError(f"{at}: needs why, a one-line reason")
        overlay = v.get("overlay")
        if not isinstance(overlay, dict) or not overlay:
            raise SchedportError(f"{at}: needs overlay, a table of engine-config sections")
        for sec, keys in overlay.items():
            if sec not in OVERLAY_SECTIONS:
                raise SchedportError(f"{at}: an overlay changes {' and '.join(f'[{s}]' for s in OVERLAY_SECTIONS)} "
                                     f"only, got [{sec}]")
            if not isinstance(keys, dict) or not keys:
                raise SchedportError(f"{at}: overlay [{sec}] must be a table of keys")
        variants.append(Variant(vname, overlay, " ".join(why.split())))
    slo = data.get("slo", "absolute")
    if slo not in SLO_CHOICES:
        raise SchedportError(f"{where}: slo must be one of {', '.join(SLO_CHOICES)}, got {slo!r}")
    ref = data.get("slo_reference_tokens", 1024)
    if not isinstance(ref, int) or isinstance(ref, bool) or ref < 1:
        raise SchedportError(f"{where}: slo_reference_tokens must be a positive integer, got {ref!r}")
    return VariantSet(name, version, str(data.get("description", "")), tuple(variants), source, slo, ref)


def scaled_slo_profiles(base: EngineConfig, cfg: EngineConfig, ref_tokens: int) -> dict[str, dict]:
    """`cfg`'s SLO profiles scaled to its unloaded latency: each TTFT threshold times the ratio of
    cfg's to base's prefill of one fresh `ref_tokens`-token prompt alone, each TPOT threshold times
    the ratio of their batch-1 decode steps at that context; rounded to 4 significant digits.
    Why: absolute thresholds put a faster deployment into another regime (the SLO metrics then
    measure the hardware, not the scheduler); scaled ones ask each deployment the same relative
    tightness. The choice is the set's ``slo`` key and the report names it."""
    from schedport.engine.core.latency import make_latency_model

    lb, lc = make_latency_model(base), make_latency_model(cfg)
    r_ttft = lc.prefill_time(ref_tokens) / lb.prefill_time(ref_tokens)
    r_tpot = lc.iteration_time((), 1, ref_tokens + 1) / lb.iteration_time((), 1, ref_tokens + 1)
    return {n: {"ttft_s": float(f"{t * r_ttft:.4g}"), "tpot_s": float(f"{p * r_tpot:.4g}")}
            for n, (t, p) in base.slo_profiles.items()}


def _overlaid(base: EngineConfig, overlay: dict, source: str) -> EngineConfig:
    d = base.to_dict()
    if base.num_gpu_blocks_derived:
        d["engine"].pop("num_gpu_blocks")     # derived from the memory keys, which an overlay may move
    for sec, keys in overlay.items():
        d[sec] = {**d.get(sec, {}), **keys}
    return engine_config_from_dict(d, source=source)


def variant_configs(vset: VariantSet, base: EngineConfig) -> list[tuple[Variant, EngineConfig]]:
    """Each variant's engine config: the base with the overlay applied and validated. Refuses
    (one line) an overlay key the config does not know or a value it does not accept, a variant
    whose config is the base's, and two variants with one config."""
    out = []
    seen = {base.config_hash(): DEFAULT_VARIANT}
    for v in vset.variants:
        where = f"variant set {vset.name!r}, variant {v.name!r}"
        try:
            cfg = _overlaid(base, v.overlay, where)
            if vset.slo == "scaled":
                d = cfg.to_dict()
                d["slo"] = scaled_slo_profiles(base, cfg, vset.slo_reference_tokens)
                cfg = engine_config_from_dict(d, source=where)
        except ConfigError as e:
            raise SchedportError(str(e)) from None
        other = seen.setdefault(cfg.config_hash(), v.name)
        if other != v.name:
            what = "the default engine config" if other == DEFAULT_VARIANT else f"variant {other!r}'s"
            raise SchedportError(f"{where}: its overlay leaves {what} unchanged (the same engine twice "
                                 f"measures nothing); change the overlay or drop the variant")
        out.append((v, cfg))
    return out


def variants_dir(out: str | Path) -> Path:
    """Where a store keeps its variants' stores and the set's record."""
    return Path(out) / "variants"


def variant_store(out: str | Path, name: str) -> Path:
    """The results store of variant `name` of the store at `out` (the default variant: `out`)."""
    return Path(out) if name == DEFAULT_VARIANT else variants_dir(out) / name


def read_set_record(out: str | Path) -> dict | None:
    """The variant set recorded in the store at `out` (``variants/set.json``), or None."""
    path = variants_dir(out) / "set.json"
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchedportError(f"{path}: unreadable variant-set record ({e}); move it away") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("variants"), list) or "digest" not in rec:
        raise SchedportError(f"{path}: not a schedport variant-set record; move it away")
    return rec


def check_set_record(out: str | Path, vset: VariantSet) -> None:
    """Refuse (one line) a store at `out` that holds the variants of another set."""
    old = read_set_record(out)
    if old is not None and old["digest"] != vset.digest():
        raise SchedportError(f"{out}: holds the variants of set {old.get('name')!r} version {old.get('version')}, "
                             f"this run asks set {vset.name!r} version {vset.version} with other variants; "
                             f"use another --out")


def write_set_record(out: str | Path, vset: VariantSet, configs: list[tuple[Variant, EngineConfig]]) -> dict:
    """Record `vset` in the store at `out`, refusing (one line) a store that holds another set."""
    check_set_record(out, vset)
    rec = {**vset.to_dict(), "digest": vset.digest(),
           "engine_hashes": {v.name: cfg.config_hash() for v, cfg in configs}}
    d = variants_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(d / "set.json", json.dumps(rec, indent=1).encode())
    return rec


def read_variant_runs(out: str | Path, load_store) -> tuple[dict, dict]:
    """({variant: (runs DataFrame, manifest)}, set record) of the store at `out`; the default
    variant first, then the set's variants in its order. `load_store(path)` reads one store
    (the analysis's `load_store`, which verifies it). The record is checked against the stores it
    describes (`check_record_against_stores`): a variant whose store is missing, a store the
    record does not list, a record edited after the run and a store whose engine is not the one
    its variant's overlay makes are each refused in one line."""
    rec = read_set_record(out)
    if rec is None:
        return {}, {}
    where = variants_dir(out) / "set.json"
    vset = _set_of_record(rec, where)
    listed = {v.name for v in vset.variants}
    stray = sorted(p.name for p in variants_dir(out).iterdir()
                   if p.is_dir() and not p.name.startswith(".") and p.name not in listed)
    if stray:
        raise SchedportError(f"{variants_dir(out) / stray[0]}: a variant store that {where} does not list (set "
                             f"{vset.name!r} has {', '.join(sorted(listed))}); the record or the folders were changed "
                             f"after the run: restore them, or rerun into a new --out")
    runs = {}
    for v in [{"name": DEFAULT_VARIANT}, *rec["variants"]]:
        path = variant_store(out, v["name"])
        if not (path / "manifest.json").exists():
            raise SchedportError(f"{path}: the store of variant {v['name']!r} of set {rec.get('name')!r} is missing; "
                                 f"rerun `schedport run --variants {rec.get('name')}` to complete it")
        df, manifest = load_store(path)
        want = rec.get("engine_hashes", {}).get(v["name"])
        if want is not None and manifest.get("engine_hash") != want:
            raise SchedportError(f"{path}: holds engine {str(manifest.get('engine_hash'))[:12]}, but set "
                                 f"{rec.get('name')!r} records {want[:12]} for variant {v['name']!r}")
        runs[v["name"]] = (df.assign(variant=v["name"]), manifest)
    check_record_against_stores(vset, where, {name: m for name, (_, m) in runs.items()}, out)
    return runs, rec


def _set_of_record(rec: dict, where) -> VariantSet:
    """The `VariantSet` a ``set.json`` record describes, its digest recomputed from its content: a
    record edited after the run (an overlay, a variant dropped or added) is refused in one line."""
    try:
        variants = tuple(Variant(str(v["name"]), dict(v["overlay"]), str(v["why"])) for v in rec["variants"])
        vset = VariantSet(str(rec["name"]), int(rec["version"]), str(rec.get("description", "")), variants,
                          str(rec.get("source", "")), str(rec.get("slo", "absolute")),
                          int(rec.get("slo_reference_tokens", 1024)))
        digest = vset.digest()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SchedportError(f"{where}: not a schedport variant-set record ({type(e).__name__}: {e}); "
                             f"move it away") from None
    if digest != rec.get("digest"):
        raise SchedportError(f"{where}: its variants do not hash to the digest it records "
                             f"({str(rec.get('digest'))[:12]}, content {digest[:12]}): the record was edited after "
                             f"the run, so it no longer says "
                             f"how the variants were run; restore it, or rerun into a new --out")
    return vset


def check_record_against_stores(vset: VariantSet, where, manifests: dict, out) -> None:
    """Refuse (one line) a variant store whose engine is not the one its variant's overlay makes
    from the study's engine (`manifests`: {variant: store manifest}, the default's included):
    two variant folders swapped, or a store copied in from another run. The study's config is
    read back from its manifest; whether its KV-block count was derived from the memory keys is
    not recorded there, so both readings are tried."""
    base_dict = manifests[DEFAULT_VARIANT].get("engine_config")
    base_hash = manifests[DEFAULT_VARIANT].get("engine_hash")
    made: dict[str, set] = {v.name: set() for v in vset.variants}
    for derived in (False, True):
        d = copy.deepcopy(base_dict) if isinstance(base_dict, dict) else None
        if d is None:
            return
        if derived:
            d.get("engine", {}).pop("num_gpu_blocks", None)
        try:
            base = engine_config_from_dict(d, source=str(where))
            if base.config_hash() != base_hash:
                continue
            for v, cfg in variant_configs(vset, base):
                made[v.name].add(cfg.config_hash())
        except (ConfigError, SchedportError):
            continue
    for v in vset.variants:
        have = manifests[v.name].get("engine_hash")
        if made[v.name] and have not in made[v.name]:
            raise SchedportError(f"{variant_store(out, v.name)}: holds engine {str(have)[:12]}, but variant {v.name!r} "
                                 f"of {where} makes engine {sorted(made[v.name])[0][:12]} from the study's engine: "
                                 f"the variant folders were swapped or replaced after the run; restore them, or "
                                 f"rerun into a new --out")


def run_variant_sweeps(corpus_dir, out, vset: VariantSet, *, engine=None, console=None, **sweep) -> list:
    """Run (or resume) the study once per variant of `vset` into the store at `out`: the default
    variant in `out` itself (finished cells reused), each other variant in its own store under
    ``out/variants/``. `sweep` takes `run_sweep`'s selection and executor options. Every
    variant's config is checked before any cell runs. Returns the `SweepResult` of each variant,
    the default first."""
    base = engine if isinstance(engine, EngineConfig) else load_engine_config(engine)
    configs = variant_configs(vset, base)
    check_set_record(out, vset)
    results = []
    plan = [(Variant(DEFAULT_VARIANT, {}, "the study's engine"), base), *configs]
    for i, (v, cfg) in enumerate(plan):
        if console is not None:
            console.print(f"variant {v.name} ({i + 1}/{len(plan)}): {v.why}", markup=False, soft_wrap=True)
        results.append(run_sweep(corpus_dir, variant_store(out, v.name), engine=cfg, console=console, **sweep))
        if not i:      # the default's store exists now: record the set in it before its variants run
            write_set_record(out, vset, configs)
    return results


def read_variant_table(out: str | Path):
    """Every cell of the store at `out` and of its variants' stores as one pandas DataFrame with a
    ``variant`` column ("default" for the study's own cells), each store verified as `run` and
    `analyze` verify it (`schedport.study.store.verified_runs`). A store without variants gives its
    own cells, all "default"."""
    import pandas as pd

    from schedport.study.store import verified_runs

    def load(path):
        manifest = json.loads((Path(path) / "manifest.json").read_text(encoding="utf-8"))
        return verified_runs(path, manifest), manifest

    runs, _ = read_variant_runs(out, load)
    if not runs:
        df, _ = load(out)
        return df.assign(variant=DEFAULT_VARIANT)
    return pd.concat([df for df, _ in runs.values()], ignore_index=True)
