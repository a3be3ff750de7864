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
