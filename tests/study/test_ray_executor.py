"""Integration: a real local Ray instance (2 CPUs) gives the local executor's rows, row for row.

Skipped when Ray is not installed (it is the optional extra ``schedport[ray]``).
"""

from __future__ import annotations

import pandas as pd
import pytest

from schedport.study.store import KEY_COLUMNS, read_results
from schedport.study.sweep import run_sweep, write_demo_corpus

try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

pytestmark = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'schedport[ray]')")


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(KEY_COLUMNS)).reset_index(drop=True)


def test_ray_matches_local_row_for_row(tmp_path):
    import ray

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=2, requests_per_window=40)
    sel = dict(schedulers="vllm-fcfs,sjf,ltr", regions="light,near-saturation,severe", seeds=2, progress=False)
    local = run_sweep(corpus, tmp_path / "local", workers=2, **sel)
    try:
        res = run_sweep(corpus, tmp_path / "ray", executor="ray", workers=2, flush_seconds=0.0, **sel)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert res.executor == "ray" and res.cells_run == local.cells_run == 3 * 4 * 3 * 2
    assert not ray.is_initialized()  # the sweep shut down the instance it started
    a = _sorted(read_results(tmp_path / "local"))
    b = _sorted(read_results(tmp_path / "ray"))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    # capacities came from Ray workers too, and match bit for bit
    assert (tmp_path / "ray" / "capacity.json").read_text() == (tmp_path / "local" / "capacity.json").read_text()


def test_unreachable_cluster_is_one_line(tmp_path):
    from schedport.errors import SchedportError

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=1, requests_per_window=20)
    with pytest.raises(SchedportError, match="cannot start or reach the Ray cluster") as e:
        run_sweep(corpus, tmp_path / "out", executor="ray", ray_address="127.0.0.1:1", schedulers="sjf",
                  regions="light", progress=False)
    assert "\n" not in str(e.value)


def test_explain_on_ray_matches_the_local_pool(tmp_path):
    """`schedport explain --executor ray` runs the same cells through Ray workers: the variants'
    effects and the attribution equal the local pool's, and the Ray instance is shut down."""
    import ray

    from schedport.analysis.explain import explain

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=3, requests_per_window=60)
    run_sweep(corpus, tmp_path / "res", schedulers="vllm-fcfs,fastserve", regions="severe", workers=1,
              progress=False)
    ask = dict(pair="fastserve,vllm-fcfs", metric="ttft_p99_s", region="severe", sources="demo-a,demo-b",
               features=["arrival", "output"], progress=False)
    local = explain(tmp_path / "res", cache_dir=tmp_path / "cache-local", workers=2, **ask)
    try:
        on_ray = explain(tmp_path / "res", cache_dir=tmp_path / "cache-ray", executor="ray", workers=2, **ask)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert not ray.is_initialized()
    assert on_ray["run_info"]["runs"] == local["run_info"]["runs"] > 0
    assert on_ray["effects"] == local["effects"] and on_ray["attribution"] == local["attribution"]
    assert on_ray["verdict"] == local["verdict"]


def test_ray_workers_run_a_user_policy_from_the_text_they_are_sent(tmp_path):
    """A user's policy file reaches Ray workers as text (the driver's copy is gone before they run),
    and their rows are the local run's, bit for bit."""
    import ray

    from schedport.engine.core.config import load_engine_config
    from schedport.engine.policies.plugins import get_scheduler
    from schedport.study.executors import make_executor
    from schedport.study.tasks import run_chunk
    from schedport.workload.examples import make_example_trace

    pol = tmp_path / "las_remote.py"
    pol.write_text("from schedport.engine.policies.policy import Ordering, PerServedToken\n\n\n"
                   "class LeastAttained(Ordering):\n    preemptive = True\n    dynamics = PerServedToken(+1)\n\n"
                   "    def key(self, req, now):\n        return (req.generated, req.arrival, req.idx)\n")
    src = get_scheduler(f"{pol}:LeastAttained").source
    pol.unlink()
    trace, cfg = make_example_trace(120, 4), load_engine_config(None)
    cells = [("overload", 1.3, 0), ("severe", 1.6, 1)]
    local = run_chunk(trace, cfg, src, ("demo", "w", "sha", 5.0), cells)[0]
    ex = make_executor("ray", 2, None)
    try:
        h = ex.submit(run_chunk, ex.put(trace), ex.put(cfg), src, ("demo", "w", "sha", 5.0), cells, False)
        got = [res for hh, res in ex.as_completed([h], tick=1.0) if hh is not None]
    finally:
        ex.shutdown()
        if ray.is_initialized():
            ray.shutdown()
    assert got[0][0] == local and local[0]["scheduler"] == "LeastAttained"
