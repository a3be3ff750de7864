"""The public Python API: simulate one trace under one scheduler, get the per-request table and summary.

    >>> import schedport
    >>> from schedport.workload.examples import make_example_trace
    >>> res = schedport.simulate(make_example_trace(200), "vllm-fcfs", load=0.8)
    >>> res.summary["ttft_p99_s"], len(res.requests)

The names here are the stable surface; they live in `schedport.engine.runner` (one trace
through one engine) and are documented there: `load=RHO` scales the trace's time axis to offered
load RHO against the engine's `capacity` for that request mix, and every number that reaches
the engine is checked where it enters (`check_clock`, `check_metrics_horizon`).
"""

from __future__ import annotations

from schedport.engine.runner import (CAPACITY_DEFINITIONS, CAPACITY_REFERENCE, DRAIN, MAX_ARRIVAL_S,
                                     SUSTAINABLE, SimulationResult, capacity, check_clock, check_horizon,
                                     check_metrics_horizon, check_seed, check_simulation_memory,
                                     check_time_scale, load_scale, rescale, scaled, served_trace, simulate)

__all__ = ["CAPACITY_DEFINITIONS", "CAPACITY_REFERENCE", "DRAIN", "MAX_ARRIVAL_S", "SUSTAINABLE",
           "SimulationResult", "capacity", "check_clock", "check_horizon", "check_metrics_horizon",
           "check_seed", "check_simulation_memory", "check_time_scale", "load_scale", "rescale", "scaled",
           "served_trace", "simulate"]
