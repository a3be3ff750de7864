"""Engine: the vLLM-like serving engine and the scheduling policies it runs.

Engine configuration (`config`), the step latency model (`latency`), the event loop and KV
cache (`simulator`), the policies (the contract in `policy`: an `Ordering` is a key and its
dynamics; the batching modes in `batching` with the kept rank order of the ranked fill in
`ranking`; the queues the engine keeps requests in, `queues`; key orderings in `orderings`,
policies with state of their own in `vtc`, `ltr` and `mlfq`; admission gates in `gates`; the
declarations and their registry in `schedulers`),
per-request and per-run metrics (`metrics`), and one trace through one scheduler: the checks at
its entry (`inputs`), capacity, region definitions and load (`capacity`), one run of the scaled
trace (`execution`) and `simulate` (`runner`). Reads traces from `schedport.workload`; never
reads a corpus, a store or an analysis.
"""

