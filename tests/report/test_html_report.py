"""The HTML report: first-screen numbers come from portability.json and match the store; the page is
self-contained; it renders in headless Chromium when one is installed."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from _synthstore import REGIONS6, make_runs, write_store
from schedport.analysis.directions import MAIN_METRICS, metric_direction
from schedport.api import analyze
from schedport.report.html import _FORMATTERS, build_html, resolve_key
from _paths import REPO

SCHEDS5 = ["edf", "fastserve", "hrrn", "ltr", "orca"]


def _order(s, r, m):
    # sources disagree a little at high load, and metrics disagree on fairness
    if s == "burstgpt-modeled" and r == 2 and m in ("ttft_p99_s", "e2e_mean_s"):
        return [1, 0, 3, 2, 4]
    if m == "slowdown_jain":
        return [4, 3, 2, 1, 0]
    return [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    runs = make_runs(schedulers=SCHEDS5, n_windows=8, seeds=(0, 1), order=_order, spacing=0.15, noise=0.08)
    # one missing cell, to see it reported
    runs = runs[~((runs.source == "azure") & (runs.window_id == 2) & (runs.region == "light")
                  & (runs.scheduler == "hrrn"))].reset_index(drop=True)
    write_store(d, runs)
    res = analyze(d, n_boot=200, seed=3).portability
    html = (d / "report.html").read_text(encoding="utf-8")
    return d, runs, res, html


class _Spans(HTMLParser):
    """Collects (data-key, data-fmt, text) of the tagged numbers, and where the first h2 starts."""

    def __init__(self):
        super().__init__()
        self.spans, self._cur, self.in_headline = [], None, False
        self.headline_spans = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and a.get("id") == "headline":
            self.in_headline = True
        if tag == "span" and "data-key" in a:
            self._cur = [a["data-key"], a["data-fmt"], ""]

    def handle_endtag(self, tag):
        if tag == "section":
            self.in_headline = False
        if tag == "span" and self._cur is not None:
            self.spans.append(tuple(self._cur))
            self.headline_spans += self.in_headline
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur[2] += data


def test_every_first_screen_number_is_read_from_portability_json(study):
    d, _, res, html = study
    on_disk = json.loads((d / "portability.json").read_text())
    p = _Spans()
    p.feed(html)
    assert p.headline_spans >= 20
    for key, kind, text in p.spans:
        assert text == _FORMATTERS[kind](resolve_key(on_disk, key)), key
    keys = {k for k, _, _ in p.spans}
    for must in ("headline.cross_source.min_pair.value", "study_form.reversals.0.share",
                 "headline.cross_region.adjacent", "headline.flips.n_comparisons",
                 "headline.metrics.mean_pairwise_tau.ci_low", "robustness.n_protocols",
                 "study_form.reversals.0.ci_low", "study_form.reversals.0.n_comparisons",
                 "study_form.best_changes_with_metric.share", "study_form.claims.0.verdict",
                 "study_form.claims.4.here", "study_form.split_half.0.value",
                 "study_form.cross_source_half.by_pair.0.adjusted", "study_form.cross_source_tau.0.ci_low",
                 "headline.metrics.mean_pairwise_tau.value", "headline.cross_source.by_pair.0.ci_low"):
        assert must in keys
    # one interval per number: the lowest pair is shown with no interval of its own
    first = html[html.index('id="headline"'):html.index('id="figures"')]
    assert "CI of the minimum" not in first and "bias-corrected" not in first
    # the page is a pure function of the JSON on disk
    assert build_html(on_disk) == html


def _mean_ranks(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Independent recomputation: seed mean, complete blocks, within-window ranks, mean per condition."""
    avg = runs.groupby(["source", "window_id", "region", "scheduler"])[metric].mean().reset_index()
    k = avg["scheduler"].nunique()
    n = avg.groupby(["source", "window_id", "region"])["scheduler"].transform("nunique")
    avg = avg[n == k].copy()
    asc = metric_direction(metric) < 0
    avg["rank"] = avg.groupby(["source", "window_id", "region"])[metric].rank(method="average", ascending=asc)
    return avg.groupby(["source", "region", "scheduler"])["rank"].mean().reset_index()


def test_first_screen_numbers_recomputed_from_the_store(study):
    _, runs, res, _ = study
    ranks = {m: _mean_ranks(runs, m) for m in MAIN_METRICS}

    def vec(m, s, r):
        t = ranks[m]
        return t[(t.source == s) & (t.region == r)].sort_values("scheduler")["rank"].to_numpy()

    # cross-source tau per pair and region, averaged over the main metrics
    for e in res["headline"]["cross_source"]["by_pair_region"]:
        taus = [stats.kendalltau(vec(m, e["source_a"], e["region"]), vec(m, e["source_b"], e["region"])).statistic
                for m in MAIN_METRICS]
        assert e["value"] == pytest.approx(np.nanmean(taus), abs=1e-12)
    pairs = res["headline"]["cross_source"]["by_pair"]
    assert res["headline"]["cross_source"]["min_pair"]["value"] == pytest.approx(min(p["value"] for p in pairs))
    # the planted disagreement makes burstgpt-modeled pairs the least concordant
    mp = res["headline"]["cross_source"]["min_pair"]
    assert "burstgpt-modeled" in (mp["source_a"], mp["source_b"])

    # best scheduler changes with the metric: share of conditions with no common best
    changed, total = 0, 0
    for s in res["parameters"]["sources"]:
        for r in [x["name"] for x in res["parameters"]["regions"]]:
            sets = []
            for m in MAIN_METRICS:
                t = ranks[m]
                t = t[(t.source == s) & (t.region == r)]
                sets.append(set(t[t["rank"] == t["rank"].min()]["scheduler"]))
            total += 1
            changed += not set.intersection(*sets)
    assert res["headline"]["metrics"]["best_changes_with_metric"]["value"] == pytest.approx(changed / total)
    assert changed == total  # slowdown_jain's best is everyone else's worst

    # mean pairwise metric tau over main-metric pairs and conditions
    vals = []
    for s in res["parameters"]["sources"]:
        for r in [x["name"] for x in res["parameters"]["regions"]]:
            for i, a in enumerate(MAIN_METRICS):
                for b in MAIN_METRICS[i + 1:]:
                    vals.append(stats.kendalltau(vec(a, s, r), vec(b, s, r)).statistic)
    assert res["headline"]["metrics"]["mean_pairwise_tau"]["value"] == pytest.approx(np.nanmean(vals), abs=1e-12)

    # reversal comparisons: K(K-1)/2 pairs x metrics x (regions x source pairs + sources x region pairs)
    K, M, S, R = 5, len(res["parameters"]["metrics"]), 3, 3
    assert res["headline"]["reversals"]["n_comparisons"] == K * (K - 1) // 2 * M * (R * 3 + S * 3)
    assert res["headline"]["reversals"]["n_significant_practical"] == len(res["reversals"]["items"])


def test_report_is_self_contained_and_complete(study):
    _, _, res, html = study
    assert not re.search(r"""<(script|link|iframe)\b""", html, re.I)
    assert not re.search(r"""src=["']?(https?:|//)""", html, re.I)
    assert "@import" not in html and "url(" not in html
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) >= 5  # headline tau, main-metric matrix, heatmap, reversal map, trajectories, matrix
    for b64 in imgs:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    for text in ("Methodology", "Provenance", "Rankings per source and region", "the reversal map",
                 "rank trajectories", "How Portable Are LLM-Serving Scheduler Rankings", "Workload characterization skipped", "--corpus", "CC-BY 4.0",
                 "Apache-2.0", "Splitwise", "2505.09999", "MODELED", "burstgpt-modeled", "Wilson",
                 "Benjamini-Hochberg", "Wilcoxon", "complete block", "B = 200", "seed 3"):
        assert text in html, text
    assert res["provenance"]["corpus_sha256"][:16] in html
    assert "1 cell(s) are missing" in html


def test_report_without_reversals_or_second_source(tmp_path):
    runs = make_runs(sources=["azure"], schedulers=SCHEDS5[:3], n_windows=4, regions=REGIONS6[:2])
    write_store(tmp_path, runs)
    analyze(tmp_path, n_boot=30)
    html = (tmp_path / "report.html").read_text()
    assert "Only one source" in html and "No reversals to map" in html


@pytest.mark.skipif(shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(),
                    reason="Chromium not installed (Debian package 'chromium'); screenshot test skipped")
def test_report_renders_in_headless_chromium(study, tmp_path):
    d, _, _, _ = study
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    shot = tmp_path / "report.png"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", (d / "report.html").as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2000)
    # the browser parsed the whole page: its DOM holds the headline and the last section
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p2'}",
                          "--dump-dom", (d / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0
    assert 'id="headline"' in dom.stdout and 'id="provenance"' in dom.stdout


# ----------------------------------------------------------------------------- the first screen's answer


def test_the_answer_says_what_the_numbers_say(study):
    """Five generated points, each word chosen by the stated thresholds from the numbers it
    prints, and the same sentences in the HTML and in Markdown."""
    from schedport.report.answer import WORDS, answer_points, render_markdown

    _, _, res, html = study
    points = answer_points(res)
    assert len(points) == 5
    md = render_markdown(res)
    leads = ["Across traffic sources", "Across load levels", "Across metrics", "Where rankings flip",
             "How firm this is"]
    for lead in leads:
        assert f"**{lead}**" in md and f"<b>{lead}</b>" in html
    adj = min(d["adjusted"] for d in res["study_form"]["cross_source_half"]["by_pair"] if d.get("adjusted") is not None)
    word = next(w for bound, w in WORDS["sources"] if adj >= bound)
    assert f"rankings carry over {word}:" in md
    ext = res["headline"]["cross_region"]["extremes"]
    assert f"rankings {next(w for b, w in WORDS['regions'] if ext >= b)}:" in md
    flips = res["headline"]["flips"]
    assert flips["n_reversals"] == sum(e["n_reversals"] for e in res["study_form"]["reversals"])
    assert flips["n_comparisons"] == sum(e["n_comparisons"] for e in res["study_form"]["reversals"])
    assert f"{flips['n_reversals']} of {flips['n_comparisons']:,} cross-source comparisons" in md
    n_robust = sum(c["robust"] for c in res["robustness"]["claims"])
    assert (f"of the study's 5 verdicts, {n_robust} come{'s' if n_robust == 1 else ''} out the same under all "
            in md)


def test_the_answer_words_follow_their_thresholds():
    from schedport.report.answer import _word

    assert _word("sources", 0.95) == "almost fully" and _word("sources", 0.72) == "largely, not fully"
    assert _word("sources", 0.3) == "hardly" and _word("metrics", 0.06) == "do not carry over"
    assert _word("regions", 0.9) == "hold" and _word("regions", 0.35) == "change a lot"
    assert _word("metrics", None) == "cannot be told"


def test_cross_region_headline_averages_neighbours_and_extremes():
    from schedport.analysis.answer import cross_region_headline

    rows = [{"metric": m, "source": s, "region_a": a, "region_b": b, "tau": t}
            for m, s, a, b, t in [("x", "s1", "r1", "r2", 0.8), ("x", "s1", "r2", "r3", 0.6),
                                  ("x", "s1", "r1", "r3", 0.2), ("y", "s1", "r1", "r3", 0.9),
                                  ("x", "s2", "r1", "r2", 1.0), ("x", "s2", "r1", "r3", None)]]
    h = cross_region_headline(rows, ["r1", "r2", "r3"], ["x"])
    assert h["adjacent"] == pytest.approx((0.8 + 0.6 + 1.0) / 3)
    assert h["extremes"] == pytest.approx(0.2)   # y is not a main metric; s2's tau is undefined
    assert {d["source"]: d["extremes"] for d in h["by_source"]} == {"s1": pytest.approx(0.2), "s2": None}


def test_own_scheduler_and_source_get_a_card(study):
    """A user's scheduler: its mean ranks and whom it out-ranks in two thirds of the conditions;
    a user's source: its tau against the others. Neither appears without them."""
    import copy

    from schedport.analysis.answer import own_standing
    from schedport.report.answer import own_card

    _, _, res, html = study
    assert "card-own" not in html
    res = copy.deepcopy(res)
    main = res["headline"]["main_metrics"]
    regions = [r["name"] for r in res["parameters"]["regions"]]
    res["headline"]["own"] = own_standing(res["rankings"], ["edf"], main, res["parameters"]["sources"], regions)
    res["provenance"]["user_policies"] = {"edf": {"kind": "file", "spec": "mine.py:EDF", "sha256": "0" * 64}}
    res["provenance"]["data_sources"][1] = {**res["provenance"]["data_sources"][1], "user": True}
    mine = res["headline"]["own"][0]
    # _order ranks schedulers in list order except on slowdown_jain (reversed): edf is first on 4 of 5
    assert set(mine["beats"]) == {"fastserve", "hrrn", "ltr", "orca"} and mine["loses_to"] == []
    card = own_card(res)
    assert "out-ranks <b>fastserve, hrrn, ltr, orca</b>" in card
    assert "bailian</b> (your trace)" in card and "It is in none of the study" in card
    page = build_html(res)
    assert page.index("card-own") < page.index('id="figures"')


def test_study_page_is_written_from_the_store_and_names_it(study, tmp_path):
    """`schedport report --study-md` writes the study's figures from portability.json, stamped
    with the digest of the store's cells and of the file; the same store gives the same bytes."""
    import hashlib

    from typer.testing import CliRunner

    from schedport.cli import _register, app
    from schedport.study.digest import cells_digest

    d, _, res, _ = study
    _register()
    page = tmp_path / "study.md"
    r = CliRunner().invoke(app, ["report", "--results", str(d), "--study-md", str(page), "--no-html"])
    assert r.exit_code == 0, r.output
    text = page.read_text()
    digest, n = cells_digest(d / "runs")
    assert f"{n:,} cells, sha256 `{digest}`" in text
    assert hashlib.sha256((d / "portability.json").read_bytes()).hexdigest() in text
    mp = res["headline"]["cross_source"]["min_pair"]
    assert f"{mp['value']:.3f}" in text and "How Portable Are LLM-Serving Scheduler Rankings" in text
    for section in ("## The answer", "## Across sources", "## Where rankings flip", "## How robust"):
        assert section in text
    first = page.read_bytes()
    assert CliRunner().invoke(app, ["report", "--results", str(d), "--study-md", str(page),
                                    "--no-html"]).exit_code == 0
    assert page.read_bytes() == first
    # a store without an analysis: one line, exit 2
    (tmp_path / "empty").mkdir()
    import sys

    r = subprocess.run([sys.executable, "-m", "schedport.cli", "report", "--results", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "portability.json: missing; run `schedport analyze" in r.stderr


def test_figures_leave_out_what_carries_no_information(study):
    from schedport.report.figures import _data_range, trajectory_styles, trivial_metrics

    _, _, res, _ = study
    dropped = trivial_metrics(res)
    for m in dropped:
        rows = [d for d in res["concordance"]["sources"] if d["metric"] == m]
        assert all(d["tau"] is None or (d["tied"] and d["tau"] >= 0.999) for d in rows)
    assert "ttft_p99_s" not in dropped
    lo, hi = _data_range([0.45, 0.85, None, float("nan")])
    assert 0.3 < lo < 0.45 and 0.85 < hi < 1.0
    styles = trajectory_styles(res)
    assert len({c for c, _ in styles.values()}) == len(styles)   # no two coloured lines share a colour


def test_the_docs_study_page_is_the_generated_one():
    """docs/study.md is written by `schedport report --study-md` from a named store, never by hand."""
    text = (REPO / "docs" / "study.md").read_text(encoding="utf-8")
    assert text.startswith("# The study's figures\n") and "<!-- Written by `schedport report --results" in text
    assert re.search(r"\| results store \| [\d,]+ cells, sha256 `[0-9a-f]{64}` \|", text)
    assert re.search(r"\| portability.json \| sha256 `[0-9a-f]{64}` \|", text)


def test_study_page_refuses_a_file_it_did_not_write(study, tmp_path):
    """--study-md overwrites only a page it wrote: a user's other file is refused in one line."""
    import sys

    d, _, _, _ = study
    mine = tmp_path / "notes.md"
    mine.write_text("# my notes\nkeep me\n")
    r = subprocess.run([sys.executable, "-m", "schedport.cli", "report", "--results", str(d), "--study-md", str(mine),
                        "--no-html"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "not written by `schedport report --study-md`" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert mine.read_text() == "# my notes\nkeep me\n"
    page = tmp_path / "study.md"
    for _ in range(2):   # a page it wrote is rewritten
        r = subprocess.run([sys.executable, "-m", "schedport.cli", "report", "--results", str(d), "--study-md",
                            str(page), "--no-html"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr


# ----------------------------------------------------------------------------- stores of every shape


def _cli(*args):
    import sys
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def _page_text(html: str) -> str:
    import html as _h
    t = re.sub(r"<img[^>]*>|<style.*?</style>", " ", html, flags=re.S)
    t = re.sub(r"</?(b|span|sup|a|code|i|em)\b[^>]*>", "", t)
    return _h.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", t)))


def test_two_schedulers_on_two_own_sources_get_a_report_that_says_what_it_cannot_tell(tmp_path):
    """Issue 64 #19: two schedulers that tie everywhere on two user sources leave every tau undefined;
    analyze and report finish and the first screen says why nothing carries over or flips."""
    runs = make_runs(sources=["mine-a", "mine-b"], schedulers=["sjf", "vllm-fcfs"], n_windows=4,
                     regions=REGIONS6[:2], spacing=0, noise=0)
    write_store(tmp_path, runs)
    r = _cli("analyze", "--results", tmp_path, "--boot", 30, "--splits", 20, "--robustness-boot", 20)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    res = json.loads((tmp_path / "portability.json").read_text())
    assert all(d["value"] is None for d in res["headline"]["cross_source"]["by_pair"])
    r = _cli("report", "--results", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    text = _page_text((tmp_path / "report.html").read_text())
    first = text[:text.index("The study's findings")]
    assert "Across traffic sources: cannot be told in this run" in first
    assert "sjf = vllm-fcfs gave identical results" in first
    assert "no scheduler pair was tested in two sources" in first and "no two sources were compared" not in first
    # a claim this run cannot judge is not counted as robust, and the reversal claim is not judged on 0 of 0
    assert "4 cannot be judged in this run under any protocol" in first
    assert [c["verdict"] for c in res["study_form"]["claims"]][:4] == ["not comparable"] * 4


def test_an_estimate_at_the_edge_of_its_interval_says_why_on_the_same_line(study):
    """Issue 64 #20: a tau printed at the lower edge of its basic bootstrap interval carries, in the same
    sentence, that the interval corrects the estimator's bias; one well inside it does not."""
    import copy

    from schedport.report.answer import EDGE_NOTE, render_markdown

    _, _, res, _ = study
    r = copy.deepcopy(res)
    lo = min(range(len(r["headline"]["cross_source"]["by_pair"])),
             key=lambda i: r["headline"]["cross_source"]["by_pair"][i]["value"])
    d = r["headline"]["cross_source"]["by_pair"][lo]
    d.update(value=0.617, ci_low=0.615, ci_high=0.936)
    line = render_markdown(r).splitlines()[0]
    assert "0.617" in line and "0.615 to 0.936" + EDGE_NOTE + ")" in line
    d.update(value=0.7, ci_low=0.6, ci_high=0.8)
    assert EDGE_NOTE not in render_markdown(r).splitlines()[0]


def test_a_verdict_in_the_minority_of_protocols_says_so_and_not_comparable_is_not_robust(study):
    """Issue 64 #20: "does not hold" beside "holds under 79.9% of protocols" says the default protocol is in
    the minority; a claim no protocol can judge is not counted as robust in the answer or the card."""
    import copy

    from schedport.report.answer import render_markdown

    _, _, res, _ = study
    r = copy.deepcopy(res)
    rob = r["robustness"]
    c0, c1 = r["study_form"]["claims"][0], r["study_form"]["claims"][1]
    j0 = next(j for j, c in enumerate(rob["claims"]) if c["id"] == c0["id"])
    j1 = next(j for j, c in enumerate(rob["claims"]) if c["id"] == c1["id"])
    c0["verdict"] = "does not hold"
    rob["claims"][j0].update(robust=False, share_holds=0.799, verdicts={"holds": 0.799, "does not hold": 0.201},
                             depends_on=["scheduler_set"])
    c1["verdict"] = "not comparable"
    rob["claims"][j1].update(robust=True, share_holds=0.0, verdicts={"not comparable": 1.0}, depends_on=[])
    text = _page_text(build_html(r))
    row0 = text[text.index(c0["study"]):]
    assert "does not hold depends on scheduler_set (holds under 79.9% of" in row0[:400]
    assert "the default protocol, which gives \u201cdoes not hold\u201d, is in the minority" in row0[:600]
    row1 = text[text.index(c1["study"]):]
    assert "not comparable under any of the" in row1[:400] and "robust:" not in row1[:400]
    md = render_markdown(r)
    assert "1 cannot be judged in this run under any protocol" in md
    assert "the default protocol's verdict is the minority one" in md


def test_the_docs_tell_a_new_user_what_they_need():
    """Issue 64 #20: where the commands are after `make quick`, no promise of a PyPI install, why the
    protocol count differs between studies, and how to size one's own windows."""
    root = REPO
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "`.venv/bin/schedport" in readme and "source .venv/bin/activate" in readme
    assert "is all you need" not in readme
    assert "is all you need" not in (root / "docs" / "own-scheduler.md").read_text(encoding="utf-8").replace(
        "an installed schedport is all you need", "")
    assert "31,104 is the product" in readme and "15,552" in readme and "7,776" in readme
    corpus = (root / "docs" / "corpus.md").read_text(encoding="utf-8")
    guide = corpus[corpus.index("### How many windows, and how long"):]
    assert "at least 10 per source" in guide and "about 1,000 requests each" in guide
    assert corpus.index("## Bring your own trace") < corpus.index("### How many windows, and how long")
