"""The engine's two execution modes, one switch: `exact` (the oracle) or fast (the default).

Both give bit-identical per-request results. ``exact=True`` runs the core `Simulator`
(`schedport.engine.core.simulator`), which steps every iteration request by request; the default
runs `FastSimulator` (`schedport.engine.fast.simulator`), which advances decoding requests as a
cohort and fast-forwards through runs of identical decode steps.

With ``[engine] enable_prefix_caching = true`` the two are `CachingSimulator`
(`schedport.engine.core.caching`) and `CachingFastSimulator` (`schedport.engine.fast.caching`),
which fast-forwards decode runs but plans every step request by request.
"""

from __future__ import annotations

from schedport.engine.core.caching import CachingSimulator
from schedport.engine.core.simulator import Simulator
from schedport.engine.fast.caching import CachingFastSimulator
from schedport.engine.fast.simulator import FastSimulator


def make_simulator(trace, policy, config, latency, *, exact: bool = False, **options) -> Simulator:
    """A simulator of `trace` under `policy` in the chosen mode; `options` are `Simulator`'s
    keywords (seed, horizon_s, observer, progress)."""
    if config.enable_prefix_caching:
        cls = CachingSimulator if exact else CachingFastSimulator
    else:
        cls = Simulator if exact else FastSimulator
    return cls(trace, policy, config, latency, **options)
