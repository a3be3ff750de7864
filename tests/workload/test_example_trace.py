"""Tests for the synthetic example trace (first contact, tests, `make run` demo)."""

from __future__ import annotations

import numpy as np
import pytest

from schedport.errors import TraceError
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import Trace, load_trace, save_trace


def test_default_shape_and_types():
    t = make_example_trace()
    assert isinstance(t, Trace)
    assert len(t) == 1000
    assert t.name == "example"
    assert t.arrival_s.dtype == np.float64 and t.input_tokens.dtype == np.int64
    assert t.arrival_s[0] == 0.0
    assert np.all(np.diff(t.arrival_s) >= 0)
    assert set(t.client_id.tolist()) == {"chat", "code"}


def test_deterministic_per_seed():
    a, b = make_example_trace(500, seed=3), make_example_trace(500, seed=3)
    assert a.content_sha256() == b.content_sha256()
    assert make_example_trace(500, seed=4).content_sha256() != a.content_sha256()


def test_lengths_are_clipped_and_fit_8k_context():
    t = make_example_trace(5000, seed=1)
    assert t.input_tokens.min() >= 1 and t.input_tokens.max() <= 6000
    assert t.output_tokens.min() >= 1 and t.output_tokens.max() <= 1500
    assert (t.input_tokens + t.output_tokens).max() <= 8000


def test_statistics_match_the_description():
    t = make_example_trace(20_000, seed=0)
    gaps = np.diff(t.arrival_s)
    assert 4.5 < 1.0 / gaps.mean() < 5.5  # ~5 req/s
    assert 1.7 < gaps.std() / gaps.mean() < 2.3  # bursty: CV ~2
    chat = t.client_id == "chat"
    code = ~chat
    assert 0.6 < chat.mean() < 0.7
    assert 540 < np.median(t.input_tokens[chat]) < 660
    assert 1350 < np.median(t.input_tokens[code]) < 1650
    assert 160 < np.median(t.output_tokens[chat]) < 200
    assert 25 < np.median(t.output_tokens[code]) < 35


def test_round_trips_through_files(tmp_path):
    t = make_example_trace(300, seed=7)
    for name in ("ex.csv", "ex.parquet"):
        save_trace(t, tmp_path / name)
        assert load_trace(tmp_path / name).content_sha256() == t.content_sha256()


@pytest.mark.parametrize("n", [0, -5, 2.5, True])
def test_bad_request_count(n):
    with pytest.raises(TraceError, match="n_requests must be a positive integer"):
        make_example_trace(n)


def test_bad_seed():
    with pytest.raises(TraceError, match="seed must be a non-negative integer"):
        make_example_trace(10, seed=-1)
