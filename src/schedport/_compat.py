"""Old module paths, kept for one release (0.1.x) after the package was split into layers.

Until 0.1.0 every module lived at the top of the package (``schedport.sweep``,
``schedport.trace``, ...). Importing one of those names still works, with a
`DeprecationWarning` naming the new home, and gives the *same* module object, so attributes and
monkeypatches stay shared. ``schedport.engine``, ``schedport.analysis`` and ``schedport.report``
are packages now; their old top-level names (``schedport.engine.Simulator``,
``schedport.analysis.analyze``, ``schedport.report.write_report``) resolve through
`package_getattr`. Names that left their module when the layers were drawn (a command that
moved into `schedport.cli`, a renderer that moved into `schedport.report`) resolve from the old
path through `MOVED_NAMES`. To be removed in 0.2.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module name -> its home since the split into layers.
MOVED = {
    "schedport.outputs": "schedport.common.outputs",
    "schedport.guard": "schedport.common.guard",
    "schedport.trace": "schedport.workload.trace",
    "schedport.datadir": "schedport.workload.datadir",
    "schedport.corpus": "schedport.workload.corpus",
    "schedport.examples": "schedport.workload.examples",
    "schedport.sources": "schedport.workload.sources",
    "schedport.config": "schedport.engine.config",
    "schedport.latency": "schedport.engine.latency",
    "schedport.policy": "schedport.engine.policy",
    "schedport.schedulers": "schedport.engine.schedulers",
    "schedport.metrics": "schedport.engine.metrics",
    "schedport.regions": "schedport.study.regions",
    "schedport.sweep": "schedport.study.sweep",
    "schedport.store": "schedport.study.store",
    "schedport.studyform": "schedport.analysis.studyform",
    "schedport.explain": "schedport.analysis.explain",
    "schedport.validation_stats": "schedport.analysis.validation_stats",
    "schedport.replay": "schedport.realengine.replay",
    "schedport.calibrate": "schedport.realengine.calibrate",
    "schedport.validate": "schedport.realengine.validate",
    "schedport.conformance": "schedport.realengine.conformance",
    "schedport.localserver": "schedport.realengine.localserver",
}

#: package that replaced a module of the same name -> the module its old attributes now live in.
PACKAGE_OF_MODULE = {
    "schedport.engine": "schedport.engine.simulator",
    "schedport.analysis": "schedport.analysis.portability",
    "schedport.report": "schedport.report.html",
}


#: (0.1.0 module, name) -> the module the name lives in now, for names that left their module.
MOVED_NAMES = {
    # `schedport.analysis.analyze` wrote portability.json and report.html: now the API's job.
    ("schedport.analysis", "analyze"): "schedport.api",
    ("schedport.analysis", "BOOKKEEPING"): "schedport.analysis.store_loading",
    ("schedport.analysis", "ID_COLUMNS"): "schedport.analysis.store_loading",
    ("schedport.analysis", "BOUNDED_PATTERNS"): "schedport.analysis.directions",
    ("schedport.analysis", "DIRECTION_PATTERNS"): "schedport.analysis.directions",
    ("schedport.analysis", "SURVIVOR_ONLY"): "schedport.analysis.directions",
    ("schedport.analysis", "REGIME_METRICS"): "schedport.analysis.regimes",
    ("schedport.analysis", "REGIME_SCHEDULER"): "schedport.analysis.regimes",
    ("schedport.analysis", "SOURCE_INFO"): "schedport.analysis.provenance",
    ("schedport.analysis", "TIED_DISTINCT"): "schedport.analysis.concordance",
    ("schedport.analysis", "duplicate_schedulers"): "schedport.analysis.duplicates",
    ("schedport.analysis", "metric_families"): "schedport.analysis.duplicates",
    ("schedport.analysis", "analyze_command"): "schedport.cli.analyze",
    ("schedport.analysis", "check_analyze_options"): "schedport.cli.analyze",
    ("schedport.analysis", "summary_lines"): "schedport.cli.analyze",
    ("schedport.conformance", "conformance_command"): "schedport.cli.conformance",
    ("schedport.corpus", "DAY_S"): "schedport.workload.corpus_windows",
    ("schedport.corpus", "SERVEGEN_SLOT_S"): "schedport.workload.corpus_spec",
    ("schedport.corpus", "corpus_app"): "schedport.cli.corpus",
    ("schedport.corpus", "build_cmd"): "schedport.cli.corpus",
    ("schedport.corpus", "list_cmd"): "schedport.cli.corpus",
    ("schedport.corpus", "verify_cmd"): "schedport.cli.corpus",
    ("schedport.explain", "explain_command"): "schedport.cli.explain",
    ("schedport.explain", "fig_effects"): "schedport.report.explain",
    ("schedport.explain", "render_section"): "schedport.report.explain",
    ("schedport.policy", "Policy"): "schedport.engine.schedulers",
    ("schedport.policy", "BoundPolicy"): "schedport.engine.schedulers",
    ("schedport.policy", "Continuous"): "schedport.engine.batching",
    ("schedport.policy", "Selective"): "schedport.engine.batching",
    ("schedport.policy", "StallFree"): "schedport.engine.batching",
    ("schedport.policy", "Static"): "schedport.engine.batching",
    # the containers became the engine's queues when a policy's ordering became a key
    ("schedport.policy", "Fifo"): "schedport.engine.queues",
    ("schedport.policy", "StaticKey"): "schedport.engine.queues",
    ("schedport.policy", "SortedEachStep"): "schedport.engine.queues",
    ("schedport.policy", "AdmitAll"): "schedport.engine.gates",
    ("schedport.report", "LINESTYLES"): "schedport.report.style",
    ("schedport.report", "MARKERS"): "schedport.report.style",
    ("schedport.report", "MAP_ROWS"): "schedport.report.figures",
    ("schedport.sweep", "ANALYSIS_TEMP_FILES"): "schedport.api",
    ("schedport.sweep", "analysis_outputs_cleaned"): "schedport.api",
    ("schedport.sweep", "check_analysable"): "schedport.cli.study",
    ("schedport.sweep", "run_command"): "schedport.cli.study",
    ("schedport.validation_stats", "ROW_CAP"): "schedport.report.validation",
    ("schedport.validation_stats", "fig_sim_vs_real"): "schedport.report.validation",
    ("schedport.validation_stats", "render_validation_section"): "schedport.report.validation",
    ("schedport.validation_stats", "write_validation_html"): "schedport.report.validation",
}


def moved_name(old_module: str, name: str):
    """`name` as 0.1.0's `old_module` had it, from its new home (AttributeError if it never was)."""
    home = MOVED_NAMES.get((old_module, name))
    if home is None:
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    _warn(f"{old_module}.{name}", f"{home}.{name}")
    return value


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old name goes in schedport 0.2", DeprecationWarning,
                  stacklevel=3)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        _warn(spec.name, MOVED[spec.name])
        module = importlib.import_module(MOVED[spec.name])
        if "__getattr__" not in vars(module) and any(old == spec.name for old, _ in MOVED_NAMES):
            # the names that left this module resolve from it too (PEP 562), after its own names
            old = spec.name
            module.__getattr__ = lambda name: moved_name(old, name)
        return module

    def exec_module(self, module):
        # Already executed under its new name; the import system now records it under the
        # old name too (sys.modules[old] is the same object).
        pass


def install() -> None:
    """Make the old module names importable (once per interpreter)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def package_getattr(package: str, name: str):
    """An old module-level attribute of a module that became ``package`` (e.g. Simulator)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if (package, name) in MOVED_NAMES:
        return moved_name(package, name)
    home = PACKAGE_OF_MODULE[package]
    value = getattr(importlib.import_module(home), name)   # AttributeError if it never existed
    _warn(f"{package}.{name}", f"{home}.{name}")
    return value
