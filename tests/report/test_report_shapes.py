"""The report is right for every store shape the command line accepts (issue 64).

A property-based test builds small synthetic stores of many shapes: 1 to 4 schedulers, 1 to 3
sources (built-in, the user's own, or both), 1 to 3 regions, schedulers that tie everywhere (every
tau undefined) or differ, a planted cross-source flip or none, and a plain store, one run on two
engine variants, or one run on two deployments; with and without the robustness multiverse. For
each, `schedport analyze` and `schedport report` finish with exit 0, and on the page:

- every tagged number is the value at its path in the portability.json on disk;
- every number in the first screen's sentences is such a tagged value, or a count of a list the
  JSON holds (schedulers, sources, regions, main metrics, claims);
- no sentence contradicts another block: one source / one region / no flip / not comparable / the
  variants ran are said the same way in the answer, the claims card and the detail cards.

The named shapes run as explicit examples; hypothesis adds `N_EXAMPLES` more (derandomized, so
`make test` always tries the same ones).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from _synthstore import MANIFEST, REGIONS6, make_runs, write_store
from schedport.cli import _register, app
from schedport.errors import SchedportError
from schedport.report.answer import CLAIM_NAMES, Num, answer_points
from schedport.report.numbers import FORMATTERS, resolve_key

N_EXAMPLES = 6
BUILTIN = ["azure", "bailian", "burstgpt-modeled"]
OWN = ["mine-a", "mine-b"]
SCHEDS = ["vllm-fcfs", "sjf", "edf", "srpt"]
SHAPES_TRIED: list[dict] = []


def _variant_set(kind: str, tmp: Path) -> Path:
    """A two-variant set: engine variants (latency scales) or deployments (two fitted deployments)."""
    f = tmp / f"{kind}.toml"
    if kind == "variants":
        f.write_text('name = "two"\ndescription = "two latency scales"\n'
                     '[variants.decode-up]\nwhy = "w"\noverlay = { latency = { decode_scale = 1.1 } }\n'
                     '[variants.prefill-up]\nwhy = "w"\noverlay = { latency = { prefill_scale = 1.2 } }\n')
    else:
        from schedport.engine.core.deployments import engine_overlay

        parts = ['name = "two-deployments"\ndescription = "two deployments"\n']
        for name in ("llama2-7b-a100", "llama2-7b-h100"):
            eng = ", ".join(f"{k} = {v!r}" for k, v in engine_overlay(name).items())
            parts.append(f'[variants.{name}]\nwhy = "w"\noverlay = {{ engine = {{ {eng} }}, '
                         f'latency = {{ deployment = "{name}" }} }}\n')
        f.write_text("".join(parts))
    return f


def build_store(path: Path, shape: dict) -> None:
    """Write a store of `shape` (see `shapes`) under `path`."""
    k, sources, regions = shape["k"], shape["sources"], REGIONS6[:shape["regions"]]
    schedulers = SCHEDS[:k]
    flip_source = sources[1] if shape["flip"] and len(sources) > 1 and k > 1 else None

    def order(s, r, m):
        base = list(range(k))
        if s == flip_source:
            base[0], base[1] = base[1], base[0]
        return base

    tied = shape["tied"]
    runs = make_runs(sources=sources, schedulers=schedulers, regions=regions, n_windows=8,
                     spacing=0.0 if tied else 0.3, noise=0.0 if tied else 0.02, order=order,
                     distinct_metrics=not tied, seed=shape["seed"])
    axis = shape["axis"]
    if axis is None:
        write_store(path, runs)
        return
    from schedport.engine.core.config import EngineConfig
    from schedport.study.variants import load_variant_set, variant_configs, variant_store, write_set_record

    base = EngineConfig()
    vset = load_variant_set(_variant_set(axis, path.parent))
    configs = variant_configs(vset, base)
    for i, (name, cfg) in enumerate([("default", base)] + [(v.name, c) for v, c in configs]):
        man = {**MANIFEST, "engine_config": cfg.to_dict(), "engine_hash": cfg.config_hash()}
        r = runs.copy()
        if i and k > 1 and not tied:   # each variant moves the best scheduler a little
            num = r.select_dtypes("number").columns.difference(["window_id", "seed", "rho", "time_scale"])
            r.loc[r.scheduler == schedulers[0], num] *= 1.0 + 0.03 * i
        write_store(variant_store(path, name), r, man)
    write_set_record(path, vset, configs)


@st.composite
def shapes(draw) -> dict:
    own_only = draw(st.booleans())
    pool = OWN if own_only else draw(st.sampled_from([BUILTIN, BUILTIN[:1] + OWN[:1], BUILTIN[1:]]))
    return {"k": draw(st.integers(1, 4)), "sources": pool[:draw(st.integers(1, len(pool)))],
            "regions": draw(st.integers(1, 3)), "tied": draw(st.booleans()), "flip": draw(st.booleans()),
            "axis": draw(st.sampled_from([None, None, "variants", "deployments"])),
            "robustness": draw(st.booleans()), "seed": draw(st.integers(0, 3))}


def _shape(k=3, sources=("azure", "bailian"), regions=2, tied=False, flip=False, axis=None, robustness=False):
    return {"k": k, "sources": list(sources), "regions": regions, "tied": tied, "flip": flip, "axis": axis,
            "robustness": robustness, "seed": 0}


def _text(html: str) -> str:
    import html as _h

    t = re.sub(r"<img[^>]*>|<style.*?</style>", " ", html, flags=re.S)
    t = re.sub(r"</?(b|span|sup|a|code|i|em)\b[^>]*>", "", t)
    return _h.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", t)))


_SPAN = re.compile(r'<span class="num" data-key="([^"]+)" data-fmt="([^"]+)">([^<]*)</span>')


def check_page(res: dict, html: str) -> None:
    """The assertions of the module docstring for one store's portability.json and page."""
    import html as _h

    # 1. every tagged number is the JSON's value at its path
    spans = _SPAN.findall(html)
    assert spans
    for key, kind, text in spans:
        assert _h.unescape(text) == FORMATTERS[kind](resolve_key(res, key)), key
    # 2. the first screen's sentences: numbers only from tagged values or list counts of the JSON
    p = res["parameters"]
    rob = res.get("robustness") or {}
    names = sorted({*p["sources"], *p["schedulers"], *[r["name"] for r in p["regions"]], *p["metrics"],
                    *CLAIM_NAMES.values()}, key=len, reverse=True)
    counts = {len(p["schedulers"]), len(p["sources"]), len(p["regions"]), len(res["headline"]["main_metrics"]),
              *range(len(rob.get("claims") or []) + 1)}
    for point in answer_points(res):
        for part in point:
            if isinstance(part, Num):
                resolve_key(res, part.key)          # a path that exists
                continue
            t = getattr(part, "text", part)
            for n in names:
                t = t.replace(n, "")
            t = t.replace("95% interval", "").replace("--variants", "").replace("+1 (the same winner), -1 (", "")
            for num in re.findall(r"\d+(?:\.\d+)?", t):
                assert float(num) in counts, (num, part)
    # 3. no block contradicts another
    text = _text(html)
    first = text[:text.index("The study's findings")]
    one_source, one_region = len(p["sources"]) == 1, len(p["regions"]) == 1
    assert ("only one source in this run" in first) == one_source
    assert ("only one region in this run" in first) == one_region
    if one_source:
        assert "Only one source in the store" in text
    pairs = res["headline"]["cross_source"]["by_pair"]
    if pairs:
        undefined = all(d["value"] is None for d in pairs)
        assert ("Across traffic sources: cannot be told" in first) == undefined
    flips = res["headline"]["flips"]
    if flips.get("n_comparisons"):
        if flips["n_reversals"]:
            assert f"Where rankings flip: {flips['n_reversals']} of " in first
        else:
            assert "Where rankings flip: nowhere on the main metrics" in first
    if not flips.get("n_reversals"):
        assert "No reversals to map" in text
    sim = res.get("simulator") or {}
    assert ("not measured in this run" in first) == (not sim.get("n_variants"))
    if sim.get("n_variants"):
        assert f"{sim['n_variants']} engine variants" in first
    if rob.get("claims"):   # the count of verdicts reads as one sentence
        assert re.search(r"How firm this is: of the study's \d+ verdicts, (\d+ cannot be judged in this run under "
                         r"any protocol \([^)]*\)(\.|, so they count as neither robust nor not; of the other \d+, "
                         r"\d+ comes? out the same))|\d+ comes? out the same", first), first
    # a claim is "not comparable" in the claims card exactly where the answer says it cannot be judged,
    # and such a claim is never called robust
    claims = res["study_form"]["claims"]
    nc = [CLAIM_NAMES[c["id"]] for c in claims if c["verdict"] == "not comparable"]
    if rob.get("claims"):
        for c in rob["claims"]:
            sf = next(x for x in claims if x["id"] == c["id"])
            assert (sf["verdict"] == "not comparable") == (c["default"]["verdict"] == "not comparable"), c["id"]
        if nc:
            assert f"{len(nc)} cannot be judged in this run under any protocol ({'; '.join(nc)})" in first
        else:
            assert "cannot be judged" not in first
        for i, c in enumerate(claims):
            row = html[html.index(f'data-key="study_form.claims.{i}.verdict"'):]
            row = _text(row[:row.index("</tr>")])
            if c["verdict"] == "not comparable":
                assert "not comparable under any of the" in row and "robust:" not in row
    # the own card's flips per source add up to no more than the flips
    for s, n in (flips.get("by_source") or {}).items():
        assert n <= flips["n_reversals"], s


def _run(tmp: Path, shape: dict) -> tuple[dict | None, str]:
    store = tmp / "store"
    build_store(store, shape)
    _register()
    runner = CliRunner()
    args = ["analyze", "--results", str(store), "--boot", "30", "--splits", "20", "--seed", "1"]
    args += ["--robustness-boot", "10"] if shape["robustness"] else ["--no-robustness"]
    r = runner.invoke(app, args)
    if shape["k"] == 1:   # `run` refuses one scheduler up front; analyze says why in one line
        assert isinstance(r.exception, SchedportError) and "one scheduler" in str(r.exception)
        return None, ""
    assert r.exit_code == 0, (shape, r.output[-3000:], r.exception)
    r = runner.invoke(app, ["report", "--results", str(store)])
    assert r.exit_code == 0, (shape, r.output[-3000:], r.exception)
    res = json.loads((store / "portability.json").read_text())
    return res, (store / "report.html").read_text(encoding="utf-8")


@settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=shapes())
@example(shape=_shape(k=1))                                             # one scheduler: refused
@example(shape=_shape(k=2, sources=OWN, tied=True, robustness=True))   # issue 64 #19: every tau undefined
@example(shape=_shape(k=2, sources=OWN, flip=True))                    # your policy vs a baseline, your traces
@example(shape=_shape(sources=["azure"], regions=1))                   # one source, one region
@example(shape=_shape(k=4, sources=BUILTIN, regions=3, flip=True, robustness=True))
@example(shape=_shape(axis="variants"))                                # variants, 0 reversals (issue 64 #10)
@example(shape=_shape(axis="variants", flip=True))
@example(shape=_shape(axis="deployments", sources=OWN[:1] + ["azure"]))
def test_analyze_and_report_are_right_for_every_store_shape(tmp_path_factory, shape):
    SHAPES_TRIED.append(shape)
    res, html = _run(tmp_path_factory.mktemp("shape"), shape)
    if res is not None:
        check_page(res, html)


def test_the_property_test_tried_every_named_shape():
    """The shapes the issue names were all among those tried (runs after the property test)."""
    if not SHAPES_TRIED:
        pytest.skip("run with the property test")
    tried = SHAPES_TRIED
    assert any(s["k"] == 1 for s in tried) and any(s["k"] == 2 for s in tried)
    assert any(len(s["sources"]) == 1 for s in tried) and any(s["regions"] == 1 for s in tried)
    assert any(set(s["sources"]) <= set(OWN) for s in tried)
    assert any(s["axis"] == "variants" for s in tried) and any(s["axis"] == "deployments" for s in tried)
    assert any(s["axis"] is None for s in tried)
    assert len(tried) >= 8
    print(f"store shapes tried: {len(tried)}")
