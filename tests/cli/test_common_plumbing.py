"""The shared plumbing of `schedport.common`: the one atomic write and the one JSON-safe converter."""

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from schedport.common.atomic import atomic_write, atomic_write_bytes, atomic_write_text
from schedport.common.outputs import file_mode
from schedport.common.values import is_int, is_real, json_safe, json_scalar


def test_atomic_write_gives_a_plain_open_s_mode_and_replaces(tmp_path):
    p = tmp_path / "sub" / "a.json"
    atomic_write_text(p, "one\n")
    atomic_write_bytes(p, b"two\n")
    assert p.read_bytes() == b"two\n"
    assert stat.S_IMODE(p.stat().st_mode) == file_mode()
    assert sorted(os.listdir(p.parent)) == ["a.json"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")

    def half(tmp: Path):
        tmp.write_text("ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(p, half, durable=False)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_json_safe_rules():
    v = {1: np.float64("nan"), "a": (np.int64(3), np.bool_(True), math.inf), "b": np.arange(2),
         "c": Path("/x"), "d": pd.Timestamp("2026-01-02T03:04:05"), "e": np.array(2.5)}
    out = json_safe(v)
    assert out == {"1": None, "a": [3, True, None], "b": [0, 1], "c": "/x", "d": "2026-01-02T03:04:05",
                   "e": 2.5}
    assert type(out["a"][0]) is int and type(out["a"][1]) is bool
    json.dumps(out, allow_nan=False)
    with pytest.raises(TypeError):
        json_scalar([1])


def test_is_int_and_is_real_refuse_bools():
    assert is_int(np.int32(2)) and not is_int(True) and not is_int(np.bool_(True)) and not is_int(2.0)
    assert is_real(2) and is_real(np.float32(1.5)) and is_real(math.nan) and not is_real(False)
