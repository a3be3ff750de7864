"""A subset (`--windows N`, `--quick`) takes each source's windows in turn from its parts, and the
report's subset banner names what was taken."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from schedport.analysis.provenance import subset_info
from schedport.study.selection import select
from schedport.workload.corpus_manifest import Window


def _corpus():
    ws = [Window(f"azure-conv-{i:02d}", "azure", "x", Path("."), {"label": "conv"}) for i in range(5)]
    ws += [Window(f"azure-code-{i:02d}", "azure", "x", Path("."), {"label": "code"}) for i in range(5)]
    ws += [Window(f"bailian-{i:02d}", "bailian", "x", Path("."), {}) for i in range(5)]
    return SimpleNamespace(windows=ws)


def test_windows_n_takes_both_azure_parts_in_corpus_order():
    got = [w.window_id for w in select(_corpus(), windows=2).windows]
    assert got == ["azure-conv-00", "azure-code-00", "bailian-00", "bailian-01"]
    got = [w.window_id for w in select(_corpus(), windows=3).windows]
    assert got == ["azure-conv-00", "azure-conv-01", "azure-code-00", "bailian-00", "bailian-01", "bailian-02"]
    quick = [w.window_id for w in select(_corpus(), quick=True).windows]
    assert sum(w.startswith("azure-code") for w in quick) == 2 and sum(w.startswith("azure-conv") for w in quick) == 2
    assert len(select(_corpus()).windows) == 15                 # no --windows: every window


def test_the_subset_banner_names_the_windows_taken():
    st = SimpleNamespace(schedulers=["vllm-fcfs", "sjf"], regions=["moderate"], sources=["azure", "bailian"],
                         windows={"azure": ["azure-conv-00", "azure-code-00"], "bailian": ["bailian-00", "bailian-01"]})
    info = subset_info({"selectors": {"quick": True}}, st, None)
    assert "4 windows (azure: conv 1, code 1; bailian 2)" in info["reasons"]


def test_a_users_source_is_flagged_in_the_report_and_small_windows_warned():
    from _synthstore import make_runs

    from schedport.analysis.portability import compute_portability
    from schedport.report.html import build_html

    runs = make_runs(sources=["azure", "mine"], n_windows=6, regions=[("high", 0.8)])
    workload = {"available": True, "note": "", "windows": (
        [{"source": "azure", "window_id": f"azure-{i}", "n_requests": 1000} for i in range(6)]
        + [{"source": "mine", "window_id": f"mine-{i}", "n_requests": 100} for i in range(6)])}
    res = compute_portability(runs, {"selectors": {}}, n_boot=50, n_splits=10, robustness=False, workload=workload)
    page = build_html(res)
    assert "Sources from your own traces" in page and "<b>mine</b>" in page
    assert "Its windows are small</b> (median 100 requests against 1,000" in page
    assert [d["source"] for d in res["provenance"]["data_sources"] if d.get("user")] == ["mine"]
    plain = build_html(compute_portability(make_runs(sources=["azure", "bailian"], n_windows=6,
                                                     regions=[("high", 0.8)]), {"selectors": {}}, n_boot=50,
                                           n_splits=10, robustness=False))
    assert "Sources from your own traces" not in plain
