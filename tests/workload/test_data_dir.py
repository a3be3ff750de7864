"""Tests for schedport.workload.datadir: data-directory resolution, the file registry, sha256 checks
and downloads (the network is never used: the downloader is monkeypatched)."""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path

import pytest

from schedport.workload import datadir
from schedport.workload.datadir import DataFile, data_files, locate, resolve_data_dir, verify_sha256
from schedport.errors import ConfigError, DataError
from _paths import MIRROR



@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No real cache, no env override, and any accidental download fails loudly."""
    monkeypatch.delenv(datadir.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def no_network(url, dest):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(datadir, "_fetch", no_network)


def _offline(url, dest):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


# --------------------------------------------------------------------------- resolution


def test_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv(datadir.ENV_VAR, str(tmp_path / "from-env"))
    assert resolve_data_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert resolve_data_dir(None) == tmp_path / "from-env"
    monkeypatch.delenv(datadir.ENV_VAR)
    mirror = tmp_path / "shared" / "datasets"
    mirror.mkdir(parents=True)
    monkeypatch.setattr(datadir, "_mirror_candidates", lambda: [tmp_path / "nope", mirror])
    assert resolve_data_dir(None) == mirror.resolve()
    monkeypatch.setattr(datadir, "_mirror_candidates", lambda: [tmp_path / "nope"])
    assert resolve_data_dir(None) == tmp_path / "xdg" / "schedport" / "datasets"


def test_mirror_found_from_the_cwd_project_root(monkeypatch, tmp_path):
    project = tmp_path / "work" / "main"
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname='x'\n")
    mirror = tmp_path / "work" / "shared" / "datasets"
    mirror.mkdir(parents=True)
    monkeypatch.chdir(project / "src" / "pkg")
    assert mirror in datadir._mirror_candidates()
    assert resolve_data_dir(None) == mirror.resolve()


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert datadir.cache_dir() == tmp_path / ".cache" / "schedport" / "datasets"


# --------------------------------------------------------------------------- registry


def test_registry_shape():
    azure = [f for f in data_files().values() if f.source == "azure"]
    serve = [f for f in data_files().values() if f.source == "servegen"]
    burst = [f for f in data_files().values() if f.source == "burstgpt"]
    assert {f.name for f in azure} == {"AzureLLMInferenceTrace_conv.csv",
                                       "AzureLLMInferenceTrace_code.csv"}
    assert len(serve) == 162 + 147
    assert len(burst) == 2 and all(f.sha256 is None for f in burst)
    for f in azure + serve:
        assert len(f.sha256) == 64 and int(f.sha256, 16) >= 0
        assert f.url.startswith("https://raw.githubusercontent.com/")
    for f in serve:
        assert f.relpath.endswith(".gz") and f.original_relpath == f.relpath[:-3]
        assert len(f.original_sha256) == 64 and f.original_sha256 != f.sha256
        assert f.url.endswith(Path(f.original_relpath).name)
        assert f.download_relpath == f.original_relpath
    assert data_files()["azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"].url == (
        "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
        "AzureLLMInferenceTrace_conv.csv")
    missing = {15, 21, 41, 44, 66, 72, 73, 82, 89, 100, 112, 120, 142, 148, 156}
    ds = {int(f.name.split("-")[1]) for f in serve if "dataset" in f.name}
    assert not ds & missing and len(ds) == 147


def test_lookup_by_any_name():
    rel = "servegen-language-m-large/chunk-3-trace.csv.gz"
    for name in (rel, "chunk-3-trace.csv.gz", "chunk-3-trace.csv",
                 "servegen-language-m-large/chunk-3-trace.csv"):
        assert datadir.lookup(name).relpath == rel
    with pytest.raises(ConfigError, match="unknown data file 'nope.csv'"):
        datadir.lookup("nope.csv")


@pytest.mark.data
@pytest.mark.skipif(not MIRROR.is_dir(), reason="mirror not present")
def test_registry_matches_the_mirror_sums():
    sums = {}
    for sub, fname in (("azure-llm-inference-2023", "SHA256SUMS"),
                       ("servegen-language-m-large", "SHA256SUMS"),
                       ("servegen-language-m-large", "SHA256SUMS.original"),
                       ("mooncake-fast25", "SHA256SUMS")):
        for line in (MIRROR / sub / fname).read_text().splitlines():
            sha, name = line.split()
            name = name if "/" in name else f"{sub}/{name}"
            sums[name] = sha
    for f in data_files().values():
        if f.sha256 is not None:
            assert sums[f.relpath] == f.sha256
        if f.original_sha256 is not None:
            assert sums[f.original_relpath] == f.original_sha256
    conv = locate("AzureLLMInferenceTrace_conv.csv", MIRROR, download=False)
    assert verify_sha256(conv, data_files()[
        "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"].sha256) == sums[
        "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"]
    gz = locate("chunk-0-dataset.json", MIRROR, download=False)
    assert gz.name == "chunk-0-dataset.json.gz"
    verify_sha256(gz, datadir.lookup("chunk-0-dataset.json").sha256)


# --------------------------------------------------------------------------- verify / locate


def test_verify_sha256(tmp_path):
    p = tmp_path / "f.csv"
    p.write_bytes(b"hello\n")
    good = hashlib.sha256(b"hello\n").hexdigest()
    assert verify_sha256(p, good) == good
    assert verify_sha256(p, None) == good
    assert verify_sha256(p, good.upper()) == good
    with pytest.raises(DataError) as info:
        verify_sha256(p, "0" * 64)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"f.csv: sha256 {good} does not match the expected")


def _fake_entry(monkeypatch, payload: bytes, gz_mirror: bool = False) -> DataFile:
    sha = hashlib.sha256(payload).hexdigest()
    if gz_mirror:
        entry = DataFile("demo/x.csv.gz", "https://example.invalid/x.csv", "f" * 64,
                         "demo/x.csv", sha, source="demo")
    else:
        entry = DataFile("demo/x.csv", "https://example.invalid/x.csv", sha, source="demo")
    monkeypatch.setitem(data_files(), entry.relpath, entry)
    return entry


def test_locate_present_in_data_dir_or_cache(monkeypatch, tmp_path):
    entry = _fake_entry(monkeypatch, b"a,b\n", gz_mirror=True)
    data = tmp_path / "data"
    (data / "demo").mkdir(parents=True)
    (data / "demo" / "x.csv.gz").write_bytes(b"gz")
    assert locate("x.csv", data) == data / "demo" / "x.csv.gz"
    (data / "demo" / "x.csv.gz").unlink()
    cached = datadir.cache_dir() / "demo" / "x.csv"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"a,b\n")
    assert locate(entry.relpath, data) == cached


def test_locate_offline_names_file_url_and_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(datadir, "_fetch", _offline)
    data = tmp_path / "data"
    rel = "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv"
    with pytest.raises(DataError) as info:
        locate("AzureLLMInferenceTrace_code.csv", data)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"missing data file {rel}: not in {data}")
    assert "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/" \
           "AzureLLMInferenceTrace_code.csv" in msg
    assert f"put it in {data / 'azure-llm-inference-2023'}/" in msg
    assert "Temporary failure in name resolution" in msg
    # nothing half-written is left in the cache
    leftovers = list(datadir.cache_dir().rglob("*")) if datadir.cache_dir().exists() else []
    assert not [p for p in leftovers if p.is_file()]


def test_locate_without_download(tmp_path):
    with pytest.raises(DataError, match="downloads disabled; get it from https://github.com/"
                                        "HPMLL/BurstGPT/releases/download/v1.1/BurstGPT_1.csv"):
        locate("BurstGPT_1.csv", tmp_path, download=False)


def test_locate_downloads_verifies_and_moves_into_place(monkeypatch, tmp_path):
    payload = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
    entry = _fake_entry(monkeypatch, payload, gz_mirror=True)
    calls = []

    def fake_fetch(url, dest):
        calls.append((url, Path(dest).parent))
        Path(dest).write_bytes(payload)

    monkeypatch.setattr(datadir, "_fetch", fake_fetch)
    got = locate("x.csv.gz", tmp_path / "data")
    # stored in the cache under the public home's own (uncompressed) name
    assert got == datadir.cache_dir() / "demo" / "x.csv"
    assert got.read_bytes() == payload
    assert calls == [(entry.url, got.parent)]
    assert [p.name for p in got.parent.iterdir()] == ["x.csv"]  # temp file renamed away
    assert locate("x.csv.gz", tmp_path / "data") == got and len(calls) == 1


def test_locate_rejects_a_download_with_the_wrong_sha(monkeypatch, tmp_path):
    _fake_entry(monkeypatch, b"expected bytes")
    monkeypatch.setattr(datadir, "_fetch", lambda url, dest: Path(dest).write_bytes(b"other"))
    with pytest.raises(DataError) as info:
        locate("demo/x.csv", tmp_path / "data")
    msg = str(info.value)
    assert "\n" not in msg and "downloaded from https://example.invalid/x.csv but its sha256" in msg
    cache = datadir.cache_dir() / "demo"
    assert not any(cache.iterdir())
