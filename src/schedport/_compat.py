"""Old module paths, kept for one release (0.1.x) after the package was split into layers.

Until 0.1.0 every module lived at the top of the package (``schedport.sweep``,
``schedport.trace``, ...). Importing one of those names still works, with a
`DeprecationWarning` naming the new home, and gives the *same* module object, so attributes and
monkeypatches stay shared. ``schedport.engine``, ``schedport.analysis`` and ``schedport.report``
are packages now; their old top-level names (``schedport.engine.Simulator``,
``schedport.analysis.analyze``, ``schedport.report.write_report``) resolve through
`package_getattr`. To be removed in 0.2.
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
        return importlib.import_module(MOVED[spec.name])

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
    home = PACKAGE_OF_MODULE[package]
    value = getattr(importlib.import_module(home), name)   # AttributeError if it never existed
    _warn(f"{package}.{name}", f"{home}.{name}")
    return value
