"""The results store: atomic parts, one schema, identity checks, corruption and foreign files.

Also the capacity cache and region parsing of `schedport.study.regions`, which the store's
directory holds.
"""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest

from schedport.errors import SchedportError
from schedport.study.regions import REGIONS, capacity_cache, parse_regions, time_scale
from schedport.study.store import (KEY_COLUMNS, StoreError, StoreMismatch, engine_config_hash, open_store,
                             read_results, run_schema)

METRICS = ["n_requests", "ttft_p99_s", "client_jain", "iterations"]
CORPUS = "c" * 64
ENGINE_CONFIG = {"engine": {}}
ENGINE = engine_config_hash(ENGINE_CONFIG)
OTHER_CONFIG = {"engine": {"max_num_seqs": 8}}
OTHER = engine_config_hash(OTHER_CONFIG)


def _open(root, **kw):
    args = dict(corpus_sha256=CORPUS, engine_config=ENGINE_CONFIG, engine_hash=ENGINE,
                metric_columns=METRICS)
    args.update(kw)
    return open_store(root, **args)


def _row(window="w0", region="light", scheduler="a", seed=0, **metrics):
    row = {"source": "s", "window_id": window, "region": region, "scheduler": scheduler, "seed": seed,
           "rho": REGIONS.get(region, 0.5), "time_scale": 1.5, "capacity_rps": 3.0, "window_sha256": "w" * 64,
           "n_requests": 10, "ttft_p99_s": 0.25, "client_jain": None, "iterations": 7}
    row.update(metrics)
    return row


def _parts(root):
    return sorted(p for p in (root / "runs").iterdir() if p.name.startswith("part-"))


def test_new_store_writes_manifest_and_parts(tmp_path):
    root = tmp_path / "res"
    store, moved = _open(root)
    assert moved is None
    m = json.loads((root / "manifest.json").read_text())
    assert m["kind"] == "schedport-results" and m["corpus_sha256"] == CORPUS and m["engine_hash"] == ENGINE
    assert m["columns"][:5] == [["source", "string"], ["window_id", "string"], ["region", "string"],
                                ["scheduler", "string"], ["seed", "int64"]]
    store.begin_run({"selectors": {"x": 1}})
    store.add([_row(seed=0), _row(seed=1)])
    assert store.pending == 2
    assert store.flush() == 2
    store.add([_row(window="w1", client_jain=0.9)])
    store.flush()
    store.end_run("finished", cells_run=3)
    store.close()
    assert len(_parts(root)) == 2
    df = read_results(root)
    assert len(df) == 3 and list(df.columns[:5]) == list(KEY_COLUMNS)
    # None-able metric stored as float64 NaN, the same dtype in every part
    assert df["client_jain"].dtype == "float64"
    assert df["client_jain"].isna().sum() == 2
    assert df["n_requests"].dtype == "int64" and df["seed"].dtype == "int64"
    assert (df["corpus_sha256"] == CORPUS).all() and (df["engine_hash"] == ENGINE).all()
    m = json.loads((root / "manifest.json").read_text())
    assert m["status"] == "finished" and m["cells_done"] == 3 and m["runs"][-1]["cells_run"] == 3

    store, _ = _open(root)
    assert store.done == {("s", "w0", "light", "a", 0), ("s", "w0", "light", "a", 1), ("s", "w1", "light", "a", 0)}
    assert store.region_rho == {"light": 0.3}
    store.close()


def test_every_part_has_the_declared_schema(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row(ttft_p99_s=None, client_jain=None)])  # all-None float columns
    store.flush()
    store.add([_row(seed=1, ttft_p99_s=1, client_jain=1)])  # ints in float columns
    store.flush()
    store.close()
    import pyarrow.parquet as pq

    want = run_schema(METRICS)
    for p in _parts(root):
        assert pq.read_schema(p).remove_metadata().equals(want)
    df = pd.read_parquet(root / "runs").sort_values("seed")
    assert math.isnan(df["ttft_p99_s"].iloc[0]) and df["ttft_p99_s"].iloc[1] == 1.0


def test_corrupt_part_is_reported_not_overwritten(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row()])
    store.flush()
    store.close()
    part = _parts(root)[0]
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(StoreError, match="corrupt results part") as e:
        _open(root)
    assert "\n" not in str(e.value) and part.name in str(e.value)
    assert part.exists()  # untouched
    # --force moves the whole directory aside, nothing deleted
    store, moved = _open(root, force=True)
    assert moved is not None and (moved / "runs" / part.name).exists()
    assert store.done == set()
    store.close()


def test_damage_inside_a_part_is_detected(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row(seed=i, ttft_p99_s=i / 7) for i in range(50)])
    store.flush()
    store.close()
    part = _parts(root)[0]
    data = bytearray(part.read_bytes())
    for off in range(200, len(data) // 2, 97):  # flip bytes in the data pages, footer intact
        data[off] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt results part"):
        _open(root)


def test_foreign_directories_and_files(tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(StoreError, match="not a schedport results store"):
        _open(foreign)
    assert (foreign / "thesis.tex").read_text() == "precious"

    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(StoreError, match="not a schedport results manifest"):
        _open(other)
    (other / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="unreadable results manifest"):
        _open(other)

    root = tmp_path / "res"
    store, _ = _open(root)
    store.close()
    (root / "runs" / "notes.csv").write_text("x")
    with pytest.raises(StoreError, match="unknown file in the results store"):
        _open(root)


def test_mismatched_engine_or_corpus_refused_unless_force(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row()])
    store.flush()
    store.close()
    with pytest.raises(StoreMismatch, match="engine config"):
        _open(root, engine_config=OTHER_CONFIG, engine_hash=OTHER)
    with pytest.raises(StoreMismatch, match="corpus"):
        _open(root, corpus_sha256="d" * 64)
    with pytest.raises(StoreMismatch, match="metric columns"):
        _open(root, metric_columns=METRICS + ["extra"])
    store, moved = _open(root, engine_config=OTHER_CONFIG, engine_hash=OTHER, force=True)
    assert moved.name.startswith("res.old-") and len(_parts(moved)) == 1
    assert store.done == set() and json.loads((root / "manifest.json").read_text())["engine_hash"] == OTHER
    store.close()


def test_rows_of_another_engine_inside_a_part_are_detected(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row()])
    store.flush()
    store.close()
    m = json.loads((root / "manifest.json").read_text())
    m["engine_config"], m["engine_hash"] = OTHER_CONFIG, OTHER  # manifest edited, consistently, to claim
    (root / "manifest.json").write_text(json.dumps(m))                # another engine: rows disagree
    with pytest.raises(StoreMismatch, match="another corpus or engine"):
        _open(root, engine_config=OTHER_CONFIG, engine_hash=OTHER)


def test_duplicate_cells_detected(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    store.add([_row()])
    store.flush()
    store.close()
    p = _parts(root)[0]
    (root / "runs" / p.name.replace("part-000000", "part-000001")).write_bytes(p.read_bytes())
    with pytest.raises(StoreError, match="stored twice"):
        _open(root)


def test_stale_temp_files_and_orphan_request_parts_are_cleaned(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    df = pd.DataFrame({"request_id": [0], "client_id": [None], "arrival_s": [0.0], "input_tokens": [3],
                       "output_tokens": [2], "status": ["completed"], "first_token_s": [0.1], "finish_s": [0.2],
                       "ttft_s": [0.1], "tpot_s": [0.1], "e2e_s": [0.2], "preemptions": [0]})
    store.add([_row()], [df])
    store.flush()
    store.close()
    req = sorted((root / "requests").iterdir())
    assert len(req) == 1 and req[0].name == _parts(root)[0].name
    stale = root / "runs" / (".part-000009-" + "a" * 32 + ".parquet.1234abcd.tmp")
    stale.write_bytes(b"half")
    orphan = root / "requests" / ("part-000009-" + "b" * 32 + ".parquet")
    orphan.write_bytes(req[0].read_bytes())
    store, _ = _open(root)
    store.close()
    assert not stale.exists() and not orphan.exists() and req[0].exists()
    assert len(pd.read_parquet(root / "requests")) == 1


def test_second_writer_is_locked_out(tmp_path):
    root = tmp_path / "res"
    store, _ = _open(root)
    with pytest.raises(StoreError, match="another schedport run"):
        _open(root)
    with pytest.raises(StoreError, match="another schedport run"):
        _open(root, force=True)
    store.close()
    _open(root)[0].close()


def test_killed_before_first_manifest_is_not_foreign(tmp_path):
    root = tmp_path / "res"
    (root / "runs").mkdir(parents=True)
    (root / ".lock").write_text("")
    store, _ = _open(root)
    store.close()


def test_parse_regions():
    assert list(parse_regions(None)) == list(REGIONS)
    assert parse_regions("light, severe") == {"light": 0.3, "severe": 1.6}
    assert parse_regions("mid=0.7,light") == {"mid": 0.7, "light": 0.3}
    for bad, msg in [("nope", "unknown region"), ("x=abc", "must be a number"), ("x=-1", "positive"),
                     ("light,light", "twice"), (",", "no region")]:
        with pytest.raises(SchedportError, match=msg):
            parse_regions(bad)


def test_time_scale_matches_api_load_scale():
    from schedport.engine.runner import capacity, load_scale
    from schedport.workload.examples import make_example_trace

    t = make_example_trace(40, 3)
    cap = capacity(t)
    for rho in REGIONS.values():
        assert time_scale(t, cap, rho) == load_scale(t, rho)


def test_capacity_cache_roundtrip_merge_and_corruption(tmp_path):
    from schedport.engine.core.config import EngineConfig
    from schedport.workload.examples import make_example_trace

    path = tmp_path / "capacity.json"
    a = capacity_cache(path)
    b = capacity_cache(path)
    a.put("w1", "h", 1.0 / 3.0)
    a.save()
    b.put("w2", "h", 2.5)
    b.save()  # merges a's entry instead of dropping it
    c = capacity_cache(path)
    assert c.get("w1", "h") == 1.0 / 3.0 and c.get("w2", "h") == 2.5 and c.get("w3", "h") is None
    cfg = EngineConfig()
    t = make_example_trace(30, 1)
    cap = c.capacity(t, cfg)
    c.save()
    assert capacity_cache(path).get(t.content_sha256(), cfg.config_hash() + "|sustainable") == cap
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    path.write_text("[1, 2]")
    with pytest.raises(SchedportError, match="not a schedport capacity cache"):
        capacity_cache(path)
    path.write_text(json.dumps({"kind": "schedport-capacity-cache", "schema": 1, "entries": {"k": -1}}))
    with pytest.raises(SchedportError, match="not a positive capacity"):
        capacity_cache(path)
    assert math.isfinite(cap)
