"""Real engine: schedport against a running vLLM server.

Open-loop replay (`replay`), calibration of the latency model (`calibrate`), validation of the
simulator's rankings (`validate`), step-for-step conformance with vLLM's own scheduler
(`conformance`), and a local vLLM CPU server for all of them (`localserver`). The scripts with
a leading underscore run under the *server's* interpreter and never import schedport's layers.
"""
