"""The one checked reader of portability.json (`schedport.analysis.reader`), from the command line.

Every command that reads an analysis back refuses a bad one in one line naming the file, the
field and why: a malformed ``simulator`` block under ``validate --predicted`` (8 shapes that
were a KeyError traceback), a deeply nested file (a RecursionError), a field of the wrong type
(``n_variants: "two"`` rendered as "run on two engine variants"). And the blocks name what was
run: the deployments block names the engine the store ran on, and a variant set that is not the
shipped one is named by its file and digest, never described as the shipped set.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _synthstore import MANIFEST, write_store
from test_simulator_axis import cost_ratio, planted_runs, write_variant_study
from schedport.analysis.portability import analyze
from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.core.deployments import engine_overlay
from schedport.study.variants import load_variant_set, variant_configs, variant_store, write_set_record

#: A user's variant set that calls itself `uncertainty` version 1, as the shipped set does.
USER_SET = ('name = "uncertainty"\nversion = 1\ndescription = "two decode perturbations of my own"\n'
            '[variants.decode-up]\nwhy = "mine"\noverlay = { latency = { decode_scale = 1.1 } }\n'
            '[variants.decode-down]\nwhy = "mine"\noverlay = { latency = { decode_scale = 0.9 } }\n')


def cli(*args):
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def one_line(p) -> str:
    """The single line a refused command prints (exit 2, no traceback)."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def user_set_store(tmp_path_factory):
    """A store run with a user's variant set named `uncertainty` v1, analysed (its report too)."""
    root = tmp_path_factory.mktemp("reader")
    f = root / "my-uncertainty.toml"
    f.write_text(USER_SET)
    write_variant_study(root / "s", f)
    p = cli("analyze", "--results", root / "s", "--no-robustness", "--n-boot", 60, "--splits", 10)
    assert p.returncode == 0, p.stderr
    return root / "s", f


def _runnable(res: dict) -> dict:
    """`res` with its simulator findings between schedulers a real server can run (sjf, vllm-fcfs),
    so that `validate --predicted` reads every field of them."""
    res = copy.deepcopy(res)
    sim = res["simulator"]
    for x in sim["reversals"] + sim["stable"]:
        x.update(scheduler_pair="sjf vs vllm-fcfs", scheduler_a="sjf", scheduler_b="vllm-fcfs")
    for x in sim["stable"]:
        x.update(winner="sjf", loser="vllm-fcfs")
    sim["predicted"]["strongest_reversal"] = {**sim["reversals"][0], "scheduler_pair": "fastserve vs orca"}
    return res


def _validate_predicted(tmp_path: Path, f: Path):
    eng = tmp_path / "engine.toml"
    eng.write_text("")
    return cli("validate", "--endpoint", "http://127.0.0.1:9", "--engine", eng, "--out", tmp_path / "v",
               "--corpus", tmp_path / "no-corpus", "--predicted", f)


def _drop(key):
    return lambda sim: sim["reversals"][0].pop(key)


#: Malformed simulator blocks (issue 64 #15): each was a KeyError traceback under validate --predicted.
SHAPES = {
    "reversal without its scheduler pair": (_drop("scheduler_pair"), "/simulator/reversals/0"),
    "reversal without its region": (_drop("region"), "/simulator/reversals/0"),
    "reversal at a region the analysis does not define": (
        lambda sim: sim["reversals"][0].update(region="nowhere"), "/simulator/reversals/0/region"),
    "reversal without its first source": (_drop("source_a"), "/simulator/reversals/0"),
    "reversal without its survival count": (_drop("n_survived"), "/simulator/reversals/0"),
    "stable ranking without its winner": (lambda sim: sim["stable"][0].pop("winner"), "/simulator/stable/0"),
    "stable rankings without their survival": (
        lambda sim: [x.pop("survival") for x in sim["stable"]], "/simulator/stable/0"),
    "predicted reversal without its scheduler pair": (
        lambda sim: sim["predicted"]["strongest_reversal"].pop("scheduler_pair"),
        "/simulator/predicted/strongest_reversal"),
}


def test_validate_predicted_reads_a_well_formed_simulator_block(user_set_store, tmp_path):
    """The control: the same file, well formed, passes the check (and fails later, on the corpus)."""
    store, _ = user_set_store
    f = tmp_path / "portability.json"
    f.write_text(json.dumps(_runnable(json.loads((store / "portability.json").read_text()))))
    p = _validate_predicted(tmp_path, f)
    assert "predicted reversal: sjf vs vllm-fcfs" in p.stdout, p.stdout + p.stderr
    assert "portability.json" not in one_line(p)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_validate_predicted_refuses_a_malformed_simulator_block_in_one_line(user_set_store, tmp_path, shape):
    store, _ = user_set_store
    res = _runnable(json.loads((store / "portability.json").read_text()))
    breaks, field = SHAPES[shape]
    breaks(res["simulator"])
    f = tmp_path / "portability.json"
    f.write_text(json.dumps(res))
    msg = one_line(_validate_predicted(tmp_path, f))
    assert str(f) in msg and field in msg and "not a valid portability.json" in msg, msg


def test_a_deeply_nested_portability_json_is_one_line_for_every_reader(user_set_store, tmp_path):
    """Issue 64 #16: a file nested 100,000 deep was a RecursionError traceback."""
    store, _ = user_set_store
    d = Path(shutil.copytree(store, tmp_path / "deep"))      # explain reads the analysis of a store
    f = d / "portability.json"
    f.write_text('{"schema": "schedport.portability/2", "store": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for p in (cli("report", "--results", d), cli("explain", "--results", d, "--list"),
              _validate_predicted(tmp_path, f)):
        msg = one_line(p)
        assert str(f) in msg and "nested too deeply" in msg, msg


def test_a_field_of_the_wrong_type_is_refused_not_rendered(user_set_store, tmp_path):
    """Issue 64 #11: `n_variants: "two"` rendered as "run on two engine variants"; now the report
    refuses it, naming the field."""
    store, _ = user_set_store
    res = json.loads((store / "portability.json").read_text())
    res["simulator"]["n_variants"] = "two"
    d = tmp_path / "s"
    d.mkdir()
    (d / "portability.json").write_text(json.dumps(res))
    msg = one_line(cli("report", "--results", d))
    assert "/simulator/n_variants" in msg and "a string where integer is expected" in msg, msg
    assert not (d / "report.html").exists()
    # the deployments block is described too: a deployment without its name
    res = json.loads((store / "portability.json").read_text())
    res["deployments"] = {"set": res["simulator"]["set"], "slo": "absolute", "slo_label": "x", "default": "default",
                          "deployments": [{"why": "w", "slo": None}], "sources": [], "concordance": [],
                          "tau_by_metric": [], "reversals": [], "n_reversals": 0, "by_metric": {}, "by_pair": {}}
    (d / "portability.json").write_text(json.dumps(res))
    assert "/deployments/deployments/0: the key 'name' is missing" in one_line(cli("report", "--results", d))


def test_a_users_set_named_like_the_shipped_one_is_named_by_its_file(user_set_store):
    """Issue 64 #6: a user's file named `uncertainty` v1 read as the shipped set ("within the
    calibration's fit errors"); now the analysis records it is not shipped and the report names
    the file and the set's digest."""
    store, f = user_set_store
    res = json.loads((store / "portability.json").read_text())
    s = res["simulator"]["set"]
    assert s["shipped"] is False and s["source"] == str(f) and s["name"] == "uncertainty"
    html = (store / "report.html").read_text()
    assert "within the calibration's fit errors" not in html
    assert str(f) in html and s["digest"][:12] in html and "two decode perturbations of my own" in html
    p = cli("report", "--results", store, "--no-html", "--study-md", store.parent / "study.md")
    assert p.returncode == 0, p.stderr
    md = (store.parent / "study.md").read_text()
    assert str(f) in md and "shipped with schedport" not in md


def test_the_shipped_set_is_recognised_as_shipped():
    from schedport.analysis.simulator import variant_set_info

    shipped = load_variant_set("uncertainty")
    rec = {**shipped.to_dict(), "digest": shipped.digest()}
    assert variant_set_info(rec).shipped is True
    assert variant_set_info({**rec, "digest": "0" * 64}).shipped is False      # edited: not the shipped set
    from schedport.report.simulator import simulator_card

    sim = {"set": {**rec, "shipped": True}, "n_variants": 12, "distribution": {"n_reversals": 0}, "variants": [],
           "reversals": [], "note": ""}
    card = simulator_card({"simulator": sim, "parameters": {"regions": []}})
    assert "within the calibration's fit errors" in card


def test_the_deployments_block_names_the_engine_the_store_ran_on(tmp_path):
    """Issue 64 #5: the default deployment was "Llama-3-8B on one A100-80GB" whatever --engine
    said; a study run on Llama-2-7B on an H100 is named so, in the block and the report."""
    def cfg_of(dep):
        return engine_config_from_dict({"engine": engine_overlay(dep), "latency": {"deployment": dep}})

    base = cfg_of("llama2-7b-h100")
    f = tmp_path / "set.toml"
    eng = ", ".join(f"{k} = {v!r}" for k, v in engine_overlay("llama2-7b-a100").items())
    f.write_text('name = "to-a100"\ndescription = "the same model on an A100"\n[variants.a100]\nwhy = "an A100"\n'
                 f'overlay = {{ engine = {{ {eng} }}, latency = {{ deployment = "llama2-7b-a100" }} }}\n')
    vset = load_variant_set(f)
    configs = variant_configs(vset, base)
    r0 = cost_ratio(base)
    for name, cfg in [("default", base)] + [(v.name, c) for v, c in configs]:
        man = {**MANIFEST, "engine_config": cfg.to_dict(), "engine_hash": cfg.config_hash()}
        write_store(variant_store(tmp_path / "s", name), planted_runs(cost_ratio(cfg), r0), man)
    write_set_record(tmp_path / "s", vset, configs)
    p = cli("analyze", "--results", tmp_path / "s", "--no-robustness", "--n-boot", 40, "--splits", 10)
    assert p.returncode == 0, p.stderr
    dep = json.loads((tmp_path / "s" / "portability.json").read_text())["deployments"]
    why = dep["deployments"][0]["why"]
    assert dep["deployments"][0]["name"] == "default"
    assert "Llama-2-7B" in why and "H100" in why and "Llama-3-8B" not in why and base.config_hash()[:12] in why
    html = (tmp_path / "s" / "report.html").read_text()
    assert "Llama-3-8B on one A100-80GB" not in html and "Llama-2-7B (bf16) on H100" in html


def test_analyze_refuses_a_malformed_compare_file_in_one_line(user_set_store, tmp_path):
    """`analyze --compare` reads the other analysis with the same checked reader."""
    store, _ = user_set_store
    res = json.loads((store / "portability.json").read_text())
    res["study_form"] = []
    f = tmp_path / "other.json"
    f.write_text(json.dumps(res))
    write_store(tmp_path / "plain", planted_runs(1.0, 1.0), dict(MANIFEST))
    msg = one_line(cli("analyze", "--results", tmp_path / "plain", "--no-robustness", "--n-boot", 20, "--splits", 5,
                       "--compare", f))
    assert str(f) in msg and "/study_form" in msg, msg


def test_the_first_screen_says_known_error_only_for_the_shipped_uncertainty_set(user_set_store):
    """Issue 64 #6, the first screen: a user's set named `uncertainty` is named by its file there
    too, not described as "the simulator moved within its known error"."""
    from schedport.report.answer import answer_points

    def flips_sentence(sim_set: dict) -> str:
        res = copy.deepcopy(json.loads((store / "portability.json").read_text()))
        res["simulator"]["set"] = sim_set
        res["simulator"]["distribution"].update(n_reversals=4, all=3, under_50=1)
        return "".join(p for p in answer_points(res)[4] if isinstance(p, str))

    store, f = user_set_store
    users = json.loads((store / "portability.json").read_text())["simulator"]["set"]
    text = flips_sentence(users)
    assert "moved within its known error" not in text and "a variant set of the user's own" in text
    html = (store / "report.html").read_text()
    assert str(f) in html and users["digest"][:12] in html        # the card names the file and the digest
    shipped = load_variant_set("uncertainty")
    assert "within its known error" in flips_sentence({**shipped.to_dict(), "digest": shipped.digest(),
                                                        "shipped": True})
