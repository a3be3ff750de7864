"""Start vLLM's OpenAI-compatible server with its Python garbage collector tamed.

Run with the *server's* interpreter: ``python _serve_vllm.py <api_server arguments>``.
Why: once the API server's heap is large (torch, transformers, vLLM), a full collection pauses
its event loop for a few hundred milliseconds, and every stream stalls meanwhile: measured on
the CPU server, about one probe batch in five received the last ~50 tokens of each request in
one burst after a ~350 ms pause, while the engine's own inter-token times stayed at ~7 ms. The
import-time heap is frozen out of collection and full collections are made rare; reference
counting still frees everything acyclic, which is nearly all of a server's garbage.
"""

import gc
import runpy
import sys

import vllm.entrypoints.openai.api_server  # noqa: F401  (import everything before freezing)

gc.collect()
gc.freeze()
gc.set_threshold(50_000, 50, 1_000)
sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
