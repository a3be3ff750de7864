"""The engine's core: request state, the event loop and KV cache, the latency model, config, metrics.

`simulator` holds a request's state (`Request`), the KV cache and the loop that runs one trace
through one policy, exactly, one step at a time; `config` the engine's keys; `latency` the step
latency model (with `deployments` and `profilefit`, the GPU and model profiles it is fit to);
`metrics` the per-request and per-run results. The core imports neither the policies nor the
fast mode: a policy is handed to the simulator, and the fast mode is a simulator that extends it.
"""
