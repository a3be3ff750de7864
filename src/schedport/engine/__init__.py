"""Engine: the vLLM-like serving engine and the scheduling policies it runs.

Engine configuration (`config`), the step latency model (`latency`), the event loop and KV
cache (`simulator`), the policies (`policy` mechanisms, `schedulers` registry), per-request
and per-run metrics (`metrics`), and one trace through one scheduler (`runner`). Reads traces
from `schedport.workload`; never reads a corpus, a store or an analysis.
"""


def __getattr__(name: str):
    # 0.1.0's `schedport.engine` module (Simulator, Request, ...), for one release.
    from schedport._compat import package_getattr

    return package_getattr(__name__, name)
