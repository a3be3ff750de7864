"""portability.json's schema (analysis/data/portability.schema.json) and its result objects: a
freshly analysed store conforms, a broken file or an unknown major version is refused with one
line, by the checker and by `schedport report`, and the one serialiser keeps the keys' order."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from _synthstore import SCHEDULERS13, SOURCES3, make_runs, write_store

from schedport.analysis import portability
from schedport.analysis.results import WILSON, Estimate, ReversalSummary, to_json
from schedport.analysis.schema import (SCHEMA_VERSION, check_portability, check_version, portability_schema,
                                       schema_error)
from schedport.errors import SchedportError


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A small synthetic store analysed into portability.json; (folder, the file's dict)."""
    d = write_store(tmp_path_factory.mktemp("schema") / "store",
                    make_runs(sources=SOURCES3[:2], n_windows=6, schedulers=SCHEDULERS13[:4]))
    portability.analyze(d, n_boot=40, robustness=False)
    return d, json.loads((d / "portability.json").read_text())


def test_a_fresh_analysis_conforms_to_the_shipped_schema(analysed):
    _, res = analysed
    assert res["schema"] == SCHEMA_VERSION == "schedport.portability/2"
    assert schema_error(res, portability_schema()) is None
    check_portability(res, "portability.json")


def test_a_standard_validator_reads_the_schema_the_same_way(analysed):
    """The schema is standard JSON Schema 2020-12: a standard validator, where installed, accepts
    the fresh file and refuses the broken ones the checker refuses."""
    jsonschema = pytest.importorskip("jsonschema")
    _, res = analysed
    validator = jsonschema.Draft202012Validator(portability_schema())
    jsonschema.Draft202012Validator.check_schema(portability_schema())
    assert not list(validator.iter_errors(res))
    for broken in _broken(res).values():
        assert list(validator.iter_errors(broken)) and schema_error(broken, portability_schema())


def _broken(res: dict) -> dict:
    """Copies of `res` each broken in one way."""
    out = {}
    d = copy.deepcopy(res)
    del d["headline"]["reversals"]["ci_low"]
    out["missing"] = d
    d = copy.deepcopy(res)
    d["reversals"]["n_tests"] = str(d["reversals"]["n_tests"])
    out["type"] = d
    d = copy.deepcopy(res)
    d["concordance"]["sources"][0]["tied"] = 1
    out["bool"] = d
    d = copy.deepcopy(res)
    d["headline"]["reversals"]["share"] = 1.5
    out["range"] = d
    d = copy.deepcopy(res)
    del d["rankings"]
    out["top"] = d
    return out


@pytest.mark.parametrize("kind, message", [
    ("missing", "at /headline/reversals: the key 'ci_low' is missing"),
    ("type", "at /reversals/n_tests: a string where integer is expected"),
    ("bool", "at /concordance/sources/0/tied: a integer where boolean is expected"),
    ("range", "at /headline/reversals/share: above the maximum 1"),
    ("top", "at /: the key 'rankings' is missing"),
])
def test_a_broken_file_is_refused_with_the_place_and_why(analysed, kind, message):
    _, res = analysed
    with pytest.raises(SchedportError) as e:
        check_portability(_broken(res)[kind], "x/portability.json")
    assert str(e.value) == f"x/portability.json: not a valid portability.json {message}"
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("version, ok", [("schedport.portability/2", True), ("schedport.portability/2.1", True),
                                         ("schedport.portability/3", False), ("schedport.portability/1", False),
                                         ("schedport.portability/x", False), ("other/2", False), (None, False)])
def test_only_the_known_major_version_is_read(version, ok):
    res = {"schema": version}
    if ok:
        assert check_version(res, "p.json") == 2
    else:
        with pytest.raises(SchedportError, match=r"^p\.json: (portability.json of schema major version|not a "
                                                 r"schedport portability.json)"):
            check_version(res, "p.json")


def test_the_report_refuses_an_unknown_major_version_and_a_broken_file(analysed, tmp_path):
    """`schedport report` and `render_report` check the version (and the report the structure)
    before rendering: one line, exit 2, no traceback."""
    from typer.testing import CliRunner

    from schedport.api import render_report
    from schedport.cli import _register, app

    _, res = analysed
    _register()
    for name, doc, why in [("v3", {**res, "schema": "schedport.portability/3"}, "schema major version 3"),
                           ("broken", _broken(res)["missing"], "the key 'ci_low' is missing")]:
        d = tmp_path / name
        d.mkdir()
        (d / "portability.json").write_text(json.dumps(doc))
        r = CliRunner().invoke(app, ["report", "--results", str(d)])
        assert isinstance(r.exception, SchedportError) and why in str(r.exception)
        assert "\n" not in str(r.exception) and not (d / "report.html").exists()
    # the console entry point: that line on stderr, exit 2
    r = subprocess.run([sys.executable, "-m", "schedport.cli", "report", "--results", str(tmp_path / "v3")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert "portability.json of schema major version 3, but this schedport reads version 2" in r.stderr
    with pytest.raises(SchedportError, match="schema major version 3"):
        render_report({**res, "schema": "schedport.portability/3"}, tmp_path)


def test_the_checker_refuses_a_schema_keyword_it_does_not_check():
    from schedport.analysis.schema import _known_keywords

    _known_keywords(portability_schema())
    with pytest.raises(SchedportError, match="keyword 'minItems' at /properties/notes"):
        _known_keywords({"type": "object", "properties": {"notes": {"type": "array", "minItems": 1}}})


def test_results_are_written_by_the_one_serialiser_in_their_documented_order(analysed):
    """An `Estimate` is value, ci_low, ci_high (+ boot_bias when bootstrapped); the pooled
    reversal block keeps the key order portability.json always had."""
    _, res = analysed
    assert to_json(Estimate(0.5, 0.25, 0.75, "basic bootstrap", 0.01)) == {
        "value": 0.5, "ci_low": 0.25, "ci_high": 0.75, "boot_bias": 0.01}
    assert list(to_json(Estimate.undefined())) == ["value", "ci_low", "ci_high"]
    assert to_json({"x": Estimate(float("nan"), None, 1, "m", 0)})["x"]["value"] is None
    assert list(res["reversals"]) == [k for k, _ in ReversalSummary.json_fields(_summary_like())]
    assert res["reversals"]["share_ci_method"].startswith(WILSON)


def _summary_like() -> ReversalSummary:
    e = Estimate(None, None, None, WILSON, replicated=False)
    return ReversalSummary(0, 0, 0, 0, 0, 0, e, {}, {}, {}, {}, {}, [], [])
