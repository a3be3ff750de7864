"""The architecture holds: layers, one typer importer, no cycles, no private names across modules.

The import contracts live in pyproject.toml ([tool.importlinter], docs/architecture.md) and
`make test` runs `lint-imports` before the suite. These tests show that each contract line is
load-bearing: on a copy of the package with one planted import, the full contract breaks, and
the contract without that line lets the planted import through.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "schedport"
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}
LAYERS: list[str] = CONTRACTS["layers"]["layers"]
LINT = Path(sys.executable).with_name("lint-imports")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_config(path: Path, contracts: list[dict]) -> Path:
    lines = ["[tool.importlinter]", 'root_package = "schedport"', "include_external_packages = true", ""]
    for c in contracts:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in c.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def _lint(tmp: Path, contracts: list[dict]) -> subprocess.CompletedProcess:
    """lint-imports over the package copy in `tmp` (first on the path) with these contracts."""
    cfg = _write_config(tmp / "contracts.toml", contracts)
    env = {"PYTHONPATH": str(tmp / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(LINT), "--config", str(cfg), "--no-cache"], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600)


def _copy_package(tmp: Path) -> Path:
    dst = tmp / "src" / "schedport"
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _module_file(pkg_root: Path, module: str) -> Path:
    """The file a planted import goes into: a new module inside a package layer, or the module itself."""
    rel = Path(*module.split(".")[1:])
    if (pkg_root / rel).is_dir():
        return pkg_root / rel / "_planted.py"
    return pkg_root / rel.with_suffix(".py")


def _plant(pkg_root: Path, importer: str, imported: str) -> None:
    f = _module_file(pkg_root, importer)
    with open(f, "a") as fh:
        fh.write(f"\nimport {imported}  # planted by test_architecture\n")


def _without_layer(i: int) -> dict:
    c = dict(CONTRACTS["layers"])
    c["layers"] = LAYERS[:i] + LAYERS[i + 1:]
    return c


def _first(layer: str) -> str:
    return layer.split("|")[0].strip()


def test_the_contracts_are_kept():
    p = subprocess.run([str(LINT), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


@pytest.mark.parametrize("i", range(len(LAYERS)), ids=lambda i: _first(LAYERS[i]))
def test_each_layer_line_is_load_bearing(tmp_path, i):
    # Layer i imports the layer right above it (the top layer is imported by the one below it):
    # the full contract refuses that, and the contract without line i lets it through.
    if i == 0:
        importer, imported = _first(LAYERS[1]), _first(LAYERS[0])
    else:
        importer, imported = _first(LAYERS[i]), _first(LAYERS[i - 1])
        if "|" in LAYERS[i - 1] and "|" in LAYERS[i]:   # pragma: no cover - not in this contract
            imported = LAYERS[i - 1].split("|")[1].strip()
    line = 1 if i == 0 else i
    pkg = _copy_package(tmp_path)
    _plant(pkg, importer, imported)
    full = _lint(tmp_path, [CONTRACTS["layers"]])
    assert full.returncode != 0 and f"{importer} is not allowed to import {imported}" in full.stdout, full.stdout
    cut = _lint(tmp_path, [_without_layer(line)])
    assert cut.returncode == 0, cut.stdout


def test_report_and_analysis_are_independent(tmp_path):
    pkg = _copy_package(tmp_path)
    _plant(pkg, "schedport.report", "schedport.analysis")
    p = _lint(tmp_path, [CONTRACTS["layers"]])
    assert p.returncode != 0 and "schedport.report is not allowed to import schedport.analysis" in p.stdout


def test_only_the_cli_may_import_typer(tmp_path):
    pkg = _copy_package(tmp_path)
    _plant(pkg, "schedport.engine", "typer")
    assert _lint(tmp_path, [CONTRACTS["layers"]]).returncode == 0     # the layers cannot see it
    p = _lint(tmp_path, [CONTRACTS["layers"], CONTRACTS["cli-only-typer"]])
    assert p.returncode != 0 and "schedport.engine is not allowed to import typer" in p.stdout


def test_a_cycle_inside_a_layer_is_refused(tmp_path):
    # engine.runner imports engine.config; config importing runner back is a cycle the layers
    # contract cannot see (both are in the engine layer) and the acyclic contract refuses.
    pkg = _copy_package(tmp_path)
    _plant(pkg, "schedport.engine.core.config", "schedport.engine.runner")
    assert _lint(tmp_path, [CONTRACTS["layers"]]).returncode == 0
    p = _lint(tmp_path, [CONTRACTS["acyclic"]])
    assert p.returncode != 0, p.stdout


def _private_imports() -> list[str]:
    """`from schedport.x import _name` where x is another module and _name is not a module of
    the importer's own package (a package may use its own private modules)."""
    bad = []
    for p in sorted(SRC.rglob("*.py")):
        mod = ".".join(p.relative_to(SRC.parent).with_suffix("").parts)
        pkg = mod.rsplit(".", 1)[0] if p.name != "__init__.py" else mod.removesuffix(".__init__")
        for node in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("schedport")):
                continue
            for a in node.names:
                private = a.name.startswith("_") and not a.name.startswith("__")
                own_module = (SRC.parent / Path(*node.module.split("."), a.name + ".py")).exists() \
                    and node.module in (pkg, mod.removesuffix(".__init__"))
                if private and node.module != mod and not own_module:
                    bad.append(f"{p.relative_to(SRC.parent)}:{node.lineno} imports {node.module}.{a.name}")
    return bad


def test_no_private_name_is_used_across_modules():
    assert _private_imports() == []


def test_only_the_cli_imports_typer_by_source():
    # Belt and braces for lint-imports: no library file even mentions an import of typer.
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if "cli" not in p.relative_to(SRC).parts[:1]
                 and any(isinstance(n, (ast.Import, ast.ImportFrom))
                         and any((getattr(n, "module", None) or a.name).split(".")[0] == "typer" for a in n.names)
                         for n in ast.walk(ast.parse(p.read_text())))]
    assert offenders == []


def test_the_0_1_module_paths_are_gone():
    # 0.1's top-level module paths (schedport.sweep, ...) and package attributes
    # (schedport.engine.Simulator, ...) were kept for one release; 0.2 removed them.
    import importlib

    import schedport.analysis
    import schedport.engine
    import schedport.report

    assert not (SRC / "_compat.py").exists()
    for old in ("schedport.sweep", "schedport.trace", "schedport.store", "schedport.latency"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    for pkg, name in ((schedport.engine, "Simulator"), (schedport.analysis, "analyze"),
                      (schedport.report, "write_report")):
        assert not hasattr(pkg, name), name


def test_the_engine_config_and_latency_import_without_the_analysis_stack():
    """The vLLM conformance driver runs in vLLM's own interpreter, which has numpy but none of
    pandas, pyarrow, scipy or matplotlib, and imports schedport's engine config, latency model
    and atomic write from the source tree: those must not pull the analysis stack in."""
    import subprocess
    import sys

    code = ("import sys\nfor m in ('pandas', 'pyarrow', 'scipy', 'matplotlib'): sys.modules[m] = None\n"
            "import schedport.engine.core.config, schedport.engine.core.latency, schedport.common.atomic\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("importer, imported", [
    ("schedport.engine.policies.batching", "schedport.engine.fast.ranking"),
    ("schedport.engine.core.simulator", "schedport.engine.fast.cohort"),
    ("schedport.engine.core.metrics", "schedport.engine.policies.schedulers"),
])
def test_the_engine_subpackages_keep_their_order(tmp_path, importer, imported):
    # policies never import the fast mode, and the core imports neither: one planted import of
    # each kind breaks the engine's contract, which the package layers alone cannot see.
    pkg = _copy_package(tmp_path)
    _plant(pkg, importer, imported)
    assert _lint(tmp_path, [CONTRACTS["layers"]]).returncode == 0
    p = _lint(tmp_path, [CONTRACTS["engine-house"]])
    assert p.returncode != 0 and f"- {importer} -> {imported} (l." in p.stdout, p.stdout


def _simulator_internals_touched(path: Path) -> list[str]:
    """Writes of the cohort clock or of a private attribute through a simulator reference
    (`sim.decode_clock = ...`, `self.sim._x = ...`) in one module, and any use of the clock's old
    private name (`sim.dclock`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        through_sim = (isinstance(owner, ast.Name) and owner.id == "sim") or (
            isinstance(owner, ast.Attribute) and owner.attr == "sim")
        if not through_sim:
            continue
        written = isinstance(node.ctx, (ast.Store, ast.Del))
        if node.attr == "dclock" or (written and (node.attr.startswith("_") or node.attr == "decode_clock")):
            found.append(f"{path.name}:{node.lineno} {node.attr}")
    return found


def test_policies_and_the_fast_helpers_use_the_simulators_interface(tmp_path):
    # The simulator's own classes (core, and the fast mode's cohort and simulator, which are the
    # simulator) keep its state; every other module reads the decode clock as `decode_clock` and
    # subscribes with `listen_cohort`; none moves the clock or writes a private attribute of the simulator.
    engine = SRC / "engine"
    own = {engine / "fast" / "cohort.py", engine / "fast" / "simulator.py"}
    touched = [t for p in sorted(engine.rglob("*.py")) if p not in own and "core" not in p.parts
               for t in _simulator_internals_touched(p)]
    assert touched == []

    def planted(code: str) -> list[str]:
        f = tmp_path / "planted.py"
        f.write_text((engine / "policies" / "vtc.py").read_text() + code)
        return _simulator_internals_touched(f)
    assert planted("") == []
    assert planted("\n\ndef _peek(sim):\n    return sim.decode_clock\n") == []     # reading is the interface
    assert planted("\n\ndef _tick(sim):\n    sim.decode_clock += 1\n")
    assert planted("\n\ndef _poke(self):\n    self.sim._cohort_hook = None\n")


#: The fast mode's words: what a policy would have to know to keep state in the decode cohort or
#: to plan for it. `grep -rE 'bulk|sync_all|rank_keeper|lazy_state|cohort_'` over policies/ finds
#: none of them, in code or in prose.
FAST_WORDS = r"bulk|sync_all|rank_keeper|lazy_state|cohort_|settle_sitters|_ranked_kept|rank_order"
#: Identifiers of the fast mode's state that a policy could read off a request or the simulator.
FAST_NAMES = {"sync", "pval", "done_clock", "heap_at", "decode_clock", "tracker"}
#: The fields the decode cohort keeps on a request: the fast mode's own `CohortRequest`, never the core's.
COHORT_SLOTS = {"sync", "pval", "done_clock", "heap_at"}


def _fast_words_in(path: Path) -> list[str]:
    """The fast mode's words (`FAST_WORDS`) anywhere in one module's text, and its state's names
    (`FAST_NAMES`) as identifiers (attributes, names, definitions)."""
    import re
    text = path.read_text()
    found = [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1} {m.group()}"
             for m in re.finditer(FAST_WORDS, text)]
    for node in ast.walk(ast.parse(text)):
        name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                else node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None)
        if name in FAST_NAMES:
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_the_policies_do_not_speak_the_fast_modes_language(tmp_path):
    # A policy knows one clock and one set of hooks: the decode cohort, its clock, its bulk passes
    # and its keepers live in engine/fast, which plans for the policies and keeps their state.
    found = [t for p in sorted((SRC / "engine" / "policies").glob("*.py")) for t in _fast_words_in(p)]
    assert found == []

    def planted(code: str) -> list[str]:
        f = tmp_path / "planted.py"
        f.write_text((SRC / "engine" / "policies" / "batching.py").read_text() + code)
        return _fast_words_in(f)
    assert planted("") == []
    assert planted("\n\ndef _plan(sim):\n    return sim.bulk\n")
    assert planted("\n\ndef _keep(order):\n    order.cohort_state = {}\n")
    assert planted("\n\ndef _lag(req):\n    return req.sync\n")
    assert planted("\n\ndef _clock(sim):\n    return sim.decode_clock\n")
    assert planted("\n# the members are synced with sync_all first\n")


def _cohort_slots(path: Path) -> set[str]:
    """The decode cohort's fields (`COHORT_SLOTS`, or any named cohort_*) among the `__slots__` of
    class `Request` in one module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Request":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in stmt.targets):
                    names = {c.value for c in ast.walk(stmt.value) if isinstance(c, ast.Constant)}
                    return {n for n in names if n in COHORT_SLOTS or str(n).startswith("cohort")}
    raise AssertionError(f"no Request.__slots__ in {path}")


def test_the_core_request_carries_no_cohort_field(tmp_path):
    # The cohort's fields are the fast mode's (`fast.cohort.CohortRequest`): the core's request is
    # what scheduling needs, and a planted cohort slot is refused.
    from schedport.engine.core.simulator import Request
    from schedport.engine.fast.cohort import CohortRequest
    core = SRC / "engine" / "core" / "simulator.py"
    assert _cohort_slots(core) == set()
    assert not COHORT_SLOTS & set(Request.__slots__) and COHORT_SLOTS <= set(CohortRequest.__slots__)
    planted = tmp_path / "simulator.py"
    planted.write_text(core.read_text().replace('"recomputed",\n', '"recomputed", "heap_at",\n', 1))
    assert _cohort_slots(planted) == {"heap_at"}
    planted.write_text(core.read_text().replace('"recomputed",\n', '"recomputed", "cohort_pos",\n', 1))
    assert _cohort_slots(planted) == {"cohort_pos"}


def test_the_core_simulator_declares_no_cohort_interface():
    # No stubs of the fast mode on the core loop: its planner, keepers and clock are the fast
    # simulator's alone.
    from schedport.engine.core.simulator import Simulator
    from schedport.engine.fast.simulator import FastSimulator
    fast_only = {"bulk", "cohort_n", "decode_clock", "sync", "sync_all", "cohort_leave", "plan_running_bulk",
                 "settle_sitters", "rank_keeper", "lazy_state", "listen_cohort"}
    assert not fast_only & set(dir(Simulator))
    assert fast_only - {"rank_keeper", "lazy_state", "bulk", "cohort_n", "decode_clock"} <= set(dir(FastSimulator))
