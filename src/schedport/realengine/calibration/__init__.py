"""The parts of `schedport calibrate` (`schedport.realengine.calibrate` is its entry point).

- `prometheus`: the server's ``/metrics`` text, read and summed.
- `probes`: the requests that measure the server (`Prober`), one at a time or in batches.
- `limits`: the engine limits the server reports, or that a command line gives, and the token budget.
- `running_cap`: the running-sequence cap (``max_num_seqs``).
- `latency`: the latency probes' plan and their observations.
- `fit`: the linear latency model's rows and its non-negative least-squares fit.
"""
