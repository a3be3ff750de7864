"""Schedulers from outside this package: a researcher's own file or module, or an installed package.

Wherever a scheduler is named (`schedport simulate --scheduler`, `run --schedulers`, `explain`,
the Python API's `simulate`), the name may be:

* a built-in policy (`schedport.engine.policies.schedulers.REGISTRY`);
* ``PATH.py:NAME`` -- NAME defined in the Python file at PATH;
* ``package.module:NAME`` -- NAME in an importable module;
* a name that an installed package registers in the entry-point group ``schedport.policies``
  (``[project.entry-points."schedport.policies"] las = "mypkg.policies:LAS"``).

NAME is what a built-in policy is: a `Policy` declaration (batching mode + ordering + gate), or
just an `Ordering` (or engine `Queue`) subclass, which is declared as a continuous-batching policy
named after the class, with the class's ``params`` and ``cite`` attributes when it has them. A
user's scheduler is called by its declared name everywhere results are shown; that name may not be
a built-in's.

Integrity. A user policy is identified by its source: the file's bytes (for a module, its source
file's; for an entry point, its module's), hashed with sha256 (`PolicySource`), together with the
modules of its own folder that a file imports (`local_helpers`). Any change to the file or to one
of those helpers is a new version: a results store records each user scheduler's version (what was
hashed, and the file's source text, so that `explain` reruns exactly the code that made the cells)
and refuses to resume with another (`schedport.study.store`). Workers -- a local pool or Ray -- get
the `PolicySource`, text included, and load the policy from that text, never from a path that may
differ on their machine; the helpers they import must hash as recorded.

Bad input is one line naming the file: no such file, a syntax error (with its line), no such
name (with the names the file defines), a name that is not a policy, a clash with a built-in
name. A key that raises, or returns NaN or a value that does not compare with the others, is
caught when each request arrives (`CheckedPolicy`), naming the request and the value; in exact
mode and in the policy check (`checking`) at every later evaluation too, with a write to the
request by the key or a hook. An error raised by the policy later in a run names the file and line
it came from; a `sys.exit` or `os._exit` in it is such an error (`exits_trapped`), and so are keys
whose comparison fails inside the engine (the request and the time are named).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.metadata
import operator
import os
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedport.engine.policies.batching import Continuous
from schedport.engine.policies.policy import BatchingMode, Ordering
from schedport.engine.policies.policyguard import (  # noqa: F401  (re-exported: a user policy's run checks)
    CheckedPolicy, PolicyError, checking, exit_call, exits_trapped, frame_at, line_in, one_line,
)
from schedport.engine.policies.queues import Queue
from schedport.engine.policies.schedulers import PARAM_RULES, REGISTRY, Policy, class_params, validate_scheduler_params
from schedport.errors import SchedportError

#: The entry-point group an installed package registers its policies in.
ENTRY_POINT_GROUP = "schedport.policies"
#: What a scheduler's name may be: it names store cells, report rows and comma-separated lists.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class PolicySource:
    """Where a user scheduler comes from, and the exact code: what a store records and workers load.

    `kind` is ``"file"``, ``"module"`` or ``"entry-point"``; `spec` what the user wrote (a file's
    path made absolute); `attr` the name inside the file or module; `path` the source file;
    `text` its source (a file policy is loaded from it); `distribution` the package that
    registers an entry point.

    `helpers` are the modules of a file policy's own folder that it imports, directly or through
    one another (`local_helpers`): (module name, path, sha256 of its bytes; a package's, of its
    ``.py`` files). `sha256` is the policy's version: the hash of the file's bytes, or, when it has
    helpers, the hash over that and each helper's (`policy_version`), so a changed helper is a
    new version as a changed file is.
    """

    name: str
    kind: str
    spec: str
    attr: str
    path: str
    sha256: str
    text: str = dataclasses.field(repr=False, default="")
    distribution: str | None = None
    helpers: tuple[tuple[str, str, str], ...] = ()

    def record(self, with_text: bool = True) -> dict:
        """The JSON record of this source (a store's manifest keeps it, text included)."""
        out = {"kind": self.kind, "spec": self.spec, "attr": self.attr, "path": self.path, "sha256": self.sha256}
        if self.distribution:
            out["distribution"] = self.distribution
        if self.helpers:
            out["file_sha256"] = _sha256(self.text.encode("utf-8"))
            out["helpers"] = [{"module": m, "path": p, "sha256": h} for m, p, h in self.helpers]
        if with_text:
            out["text"] = self.text
        return out

    @classmethod
    def from_record(cls, name: str, rec: dict) -> "PolicySource":
        """The source a store recorded for scheduler `name` (`record`); a damaged record is an error."""
        try:
            helpers = tuple((str(h["module"]), str(h["path"]), str(h["sha256"])) for h in rec.get("helpers") or ())
            src = cls(name=name, kind=rec["kind"], spec=rec["spec"], attr=rec["attr"], path=rec["path"],
                      sha256=rec["sha256"], text=rec.get("text", ""), distribution=rec.get("distribution"),
                      helpers=helpers)
        except (KeyError, TypeError) as e:
            raise PolicyError(f"scheduler {name!r}: its recorded source lacks {e}; the record is damaged") from None
        if src.text and policy_version(_sha256(src.text.encode("utf-8")), src.helpers) != src.sha256:
            raise PolicyError(f"scheduler {name!r}: its recorded source text does not hash to its recorded "
                              f"sha256 {src.sha256[:12]}; the record was edited")
        return src

    @property
    def label(self) -> str:
        """One phrase for messages and the report: ``las from /home/me/las.py (sha256 3f2a9c01b7e4)``."""
        where = self.path if self.kind == "file" else f"{self.spec}" + (
            f" ({self.distribution})" if self.distribution else "")
        return f"{self.name} from {where} (sha256 {self.sha256[:12]})"


@dataclass(frozen=True)
class UserPolicy(Policy):
    """A `Policy` that came from outside the package: it carries its `PolicySource`, and each of its
    runs checks the keys it is given (`CheckedPolicy`) and names the file when the policy fails."""

    source: PolicySource | None = None

    def _bound(self, sim, params: dict) -> "CheckedPolicy":
        """As `Policy`'s, with a key check at every arrival."""
        return CheckedPolicy(self, sim, params)

    def guarded(self):
        """A run of this policy traps an `os._exit` in its code (`exits_trapped`)."""
        return exits_trapped()

    def after_run(self, sim) -> None:
        """Refuse a run in which the policy wrote to a request's arrival or lengths: the engine then
        served another trace than the one its table reports. Checked in every mode (one pass over
        the requests); exact mode and the policy check catch any write at the call that made it."""
        reqs, trace = sim.requests, sim.trace
        n = len(reqs)
        for field, col, dtype in (("prompt", trace.input_tokens, np.int64), ("output", trace.output_tokens, np.int64),
                                  ("arrival", trace.arrival_s, np.float64)):
            got = np.fromiter(map(operator.attrgetter(field), reqs), dtype=dtype, count=n)
            bad = np.flatnonzero(got != col)
            if bad.size:
                i = int(bad[0])
                raise PolicyError(f"{self.source.path}: scheduler {self.name!r} wrote request {i}'s {field} "
                                  f"({col[i].item()!r} -> {got[i].item()!r}) during the run: a policy reads the "
                                  f"request and never writes it (`schedport schedulers {self.source.spec}` or "
                                  f"--exact names the call)")

    def failure(self, exc: BaseException, sim=None) -> SchedportError | None:
        """The one-line error for an exception raised during a run (of simulator `sim`, when it was
        made), when it came from this policy's code: its source file, or a helper module beside it
        (the innermost such frame); None when it did not (a schedport bug). A `SystemExit`
        (`sys.exit`, or an `os._exit` trapped by `exits_trapped`) is always the policy's: the engine
        never ends the process. Two keys that fail to compare inside the engine are the policy's
        keys: the request whose key does not order is named (`CheckedPolicy.diagnose`)."""
        if isinstance(exc, SchedportError):
            return None
        folder = str(Path(self.source.path).parent)
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if f.filename == self.source.path or str(Path(f.filename).parent) == folder]
        if isinstance(exc, SystemExit):
            return PolicyError(f"{frame_at(frames, self.source.path)}: scheduler {self.name!r} "
                               f"{exit_call(exc)}: a policy may not end the process; the run is stopped")
        if not frames and isinstance(exc, TypeError) and "not supported between instances" in str(exc):
            bound = getattr(sim, "sched", None)
            found = bound.diagnose(sim.now) if isinstance(bound, CheckedPolicy) else None
            return found or PolicyError(
                f"{self.source.path}: scheduler {self.name!r}: its keys stopped comparing with one another "
                f"during the run ({one_line(exc)}); keys must keep one shape at every evaluation "
                f"(`schedport schedulers {self.source.spec}` names the request)")
        if not frames:
            return None
        f = frames[-1]
        return PolicyError(f"{f.filename}:{f.lineno}: scheduler {self.name!r} raised "
                           f"{type(exc).__name__}: {one_line(exc)} (in {f.name})")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ============================================================================ a file policy's helpers


def policy_version(file_sha256: str, helpers) -> str:
    """A file policy's version: its file's sha256 alone, or with `helpers` ((module, path, sha256)
    of each local module it imports) the sha256 over that and each helper's name and hash."""
    if not helpers:
        return file_sha256
    body = "schedport-policy\n" + file_sha256 + "\n" + "".join(f"{m} {h}\n" for m, _, h in sorted(helpers))
    return _sha256(body.encode("utf-8"))


def local_helpers(text: str, path: Path) -> tuple[tuple[str, str, str], ...]:
    """The modules of `path`'s folder that the policy source `text` imports, directly or through one
    another: (module name, path, sha256), sorted by name. A module is local when the folder holds
    ``NAME.py`` or a package ``NAME/`` (the folder comes first on the path while the file runs, so
    that is what the import finds). Imports are read from the source (`import x`, `from x import
    y`, wherever they stand); a module imported by a computed name is not seen."""
    folder = path.parent
    found: dict[str, tuple[str, str]] = {}
    todo = [text]
    while todo:
        for name in _imported_names(todo.pop()):
            if name in found:
                continue
            target = _local_module(folder, name)
            if target is None or target == path:
                continue
            found[name] = (str(target), _module_digest(target))
            for f in _module_files(target):
                try:
                    todo.append(f.read_text(encoding="utf-8-sig"))
                except (OSError, ValueError):
                    pass        # an unreadable helper fails its import, with the import's own line
    return tuple((m, p, h) for m, (p, h) in sorted(found.items()))


def _imported_names(text: str) -> set[str]:
    import ast

    try:
        tree = ast.parse(text.removeprefix("\ufeff"))
    except (SyntaxError, ValueError):
        return set()     # the file's compile (or the helper's import) reports it, with its line
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _local_module(folder: Path, name: str) -> Path | None:
    for target in (folder / f"{name}.py", folder / name):
        if target.is_file() or (target.is_dir() and any(target.rglob("*.py"))):
            return target.resolve()
    return None


def _module_files(target: Path) -> list[Path]:
    return [target] if target.is_file() else sorted(target.rglob("*.py"))


def _module_digest(target: Path) -> str:
    """sha256 of a helper module's bytes; of a package, over each of its ``.py`` files' path and bytes."""
    try:
        if target.is_file():
            return _sha256(target.read_bytes())
        h = hashlib.sha256()
        for f in _module_files(target):
            h.update(f.relative_to(target).as_posix().encode() + b"\0" + _sha256(f.read_bytes()).encode() + b"\n")
        return h.hexdigest()
    except OSError as e:
        raise PolicyError(f"{target}: a helper of the policy cannot be read ({e.strerror or e})") from None


def _check_helpers(src: PolicySource) -> None:
    """After a file policy ran its imports: each helper the process imported is the version `src`
    records (a worker, or `explain` rerunning a store's policy, may find another one)."""
    for name, path, sha in src.helpers:
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        target = Path(file).resolve()
        if target.name == "__init__.py":
            target = target.parent
        now = _module_digest(target)
        if now != sha:
            raise PolicyError(f"{target}: this helper of scheduler {src.name or src.attr!r} hashes to {now[:12]} "
                              f"here, but the policy was recorded with its sha256 {sha[:12]} (from {path}): "
                              f"another version")


# ============================================================================ resolving a name


def is_spec(name: str) -> bool:
    """Does `name` point into a file or module (``PATH.py:NAME``, ``module:NAME``)?"""
    return ":" in name


def get_scheduler(name) -> Policy:
    """The policy a scheduler argument names: a `Policy` itself, a built-in name, ``PATH.py:NAME``,
    ``module:NAME`` or an installed entry point; anything else is a one-line error."""
    if isinstance(name, Policy):
        return name
    if isinstance(name, PolicySource):
        return from_source(name)
    if not isinstance(name, str):
        raise PolicyError(f"a scheduler is a name or a Policy, got a {type(name).__name__}")
    if name in REGISTRY:
        return REGISTRY[name]
    if is_spec(name):
        return load_spec(name)
    if name.endswith(".py"):        # a file without the policy's name: say which it defines
        _load_file(Path(name), "", name)
    eps = installed_policies()
    if name in eps:
        return load_entry_point(eps[name])
    extra = f"; installed: {', '.join(eps)}" if eps else ""
    raise PolicyError(f"unknown scheduler '{name}' (known: {', '.join(REGISTRY)}{extra}; "
                      f"or give your own as FILE.py:NAME or module:NAME)")


def resolve_schedulers(names) -> list[Policy]:
    """The policies a list of scheduler arguments names (`get_scheduler` each); a name given twice,
    directly or through a file, is a one-line error."""
    out: list[Policy] = []
    for n in names:
        pol = get_scheduler(n)
        if any(p.name == pol.name for p in out):
            raise PolicyError(f"scheduler {pol.name!r} is named twice" + (f" (as {n!r})" if n != pol.name else ""))
        out.append(pol)
    return out


def source_of(policy: Policy) -> PolicySource | None:
    """Where a policy came from (None for a built-in or a declaration made in the caller's code)."""
    return getattr(policy, "source", None)


def load_spec(spec: str) -> UserPolicy:
    """The policy ``PATH.py:NAME`` or ``module:NAME`` names (module docstring)."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise PolicyError(f"scheduler {spec!r}: expected FILE.py:NAME or module:NAME")
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _load_file(Path(target), attr, spec)
    return _load_module(target, attr, spec)


def _load_file(path: Path, attr: str, spec: str) -> UserPolicy:
    path = path.expanduser().resolve()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such policy file (from scheduler {spec!r})") from None
    except IsADirectoryError:
        raise PolicyError(f"{path}: is a directory, not a policy file (from scheduler {spec!r})") from None
    except OSError as e:
        raise PolicyError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    helpers = local_helpers(text, path)
    src = PolicySource(name="", kind="file", spec=f"{path}:{attr}", attr=attr, path=str(path),
                       sha256=policy_version(_sha256(data), helpers), text=text, helpers=helpers)
    return from_source(src)


def from_source(src: PolicySource) -> UserPolicy:
    """The policy a `PolicySource` holds, loaded from its text (files) or by import (modules, entry
    points, whose hash is checked); loaded once per process and version."""
    key = (src.kind, src.spec, src.sha256)
    got = _LOADED.get(key)
    if got is not None:
        return got
    if src.kind == "file":
        module = _exec_file(src)
        pol = _user_policy(module, src)
    else:
        mod_name = src.spec.rpartition(":")[0]
        pol = (_load_module(mod_name, src.attr, src.spec) if src.kind == "module"
               else load_entry_point(_entry_point_named(src.name, src)))
        if pol.source.sha256 != src.sha256:
            raise PolicyError(f"{pol.source.path}: hashes to {pol.source.sha256[:12]} here, but the policy "
                              f"{src.name!r} was recorded as sha256 {src.sha256[:12]}: another version")
    if src.name and pol.name != src.name:
        raise PolicyError(f"{src.path}: {src.attr} is now named {pol.name!r}, recorded as {src.name!r}")
    _LOADED[key] = pol
    return pol


_LOADED: dict[tuple[str, str, str], UserPolicy] = {}


def _exec_file(src: PolicySource) -> types.ModuleType:
    """Run a policy file's text as a fresh module named by its hash (the same name in every worker,
    so its classes pickle), with the file's directory on the path for its own helper imports."""
    mod_name = f"schedport_user_{re.sub(r'[^0-9A-Za-z_]', '_', Path(src.path).stem)}_{src.sha256[:16]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    try:
        code = compile(src.text.removeprefix("\ufeff"), src.path, "exec")    # a BOM, as Python's own reading
    except SyntaxError as e:
        raise PolicyError(f"{src.path}:{e.lineno}: syntax error: {e.msg}") from None
    module = types.ModuleType(mod_name)
    module.__file__ = src.path
    sys.modules[mod_name] = module
    folder = str(Path(src.path).parent)
    for name, _, sha in src.helpers:     # a helper imported before, by another version: import it afresh
        old = sys.modules.get(name)
        if old is not None and getattr(old, "__file__", None) and str(Path(old.__file__).resolve()).startswith(
                folder + os.sep):
            del sys.modules[name]
    sys.path.insert(0, folder)
    try:
        with exits_trapped():
            exec(code, module.__dict__)
    except SystemExit as e:
        del sys.modules[mod_name]
        raise PolicyError(f"{src.path}{line_in(e, src.path)}: loading the policy file {exit_call(e)}: a "
                          f"policy may not end the process") from None
    except Exception as e:
        del sys.modules[mod_name]
        raise PolicyError(f"{src.path}{line_in(e, src.path)}: loading the policy file raised "
                          f"{type(e).__name__}: {one_line(e)}") from None
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    try:
        _check_helpers(src)
    except PolicyError:
        del sys.modules[mod_name]
        raise
    return module


def _load_module(mod_name: str, attr: str, spec: str) -> UserPolicy:
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise PolicyError(f"{mod_name}: no such module ({one_line(e)}; from scheduler {spec!r})") from None
    except SyntaxError as e:
        raise PolicyError(f"{e.filename}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:
        raise PolicyError(f"{mod_name}: importing it raised {type(e).__name__}: {one_line(e)}") from None
    return _user_policy(module, _module_source(module, mod_name, "module", spec, attr))


def _module_source(module, where: str, kind: str, spec: str, attr: str, dist: str | None = None) -> PolicySource:
    """The `PolicySource` of an imported module: its source file, hashed."""
    path = getattr(module, "__file__", None)
    if not path:
        raise PolicyError(f"{where}: its module has no source file to identify it by (a namespace package?)")
    data = Path(path).read_bytes()
    return PolicySource(name="", kind=kind, spec=spec, attr=attr, path=str(Path(path).resolve()),
                        sha256=_sha256(data), text=data.decode("utf-8", "replace"), distribution=dist)


def _user_policy(module: types.ModuleType, src: PolicySource, name: str | None = None) -> UserPolicy:
    """Declare the object `src.attr` of `module` as a `UserPolicy` (checked: a policy, a free name)."""
    where = src.path
    if not src.attr or not hasattr(module, src.attr):
        found = [k for k, v in vars(module).items() if not k.startswith("_") and _is_policy_like(v)
                 and (isinstance(v, Policy) or v.__module__ == module.__name__)]
        has = f"it defines {', '.join(found)}" if found else "it defines no Policy or Ordering subclass"
        if not src.attr:
            raise PolicyError(f"{where}: name the policy as {Path(where).name}:NAME ({has})")
        raise PolicyError(f"{where}: no policy named {src.attr!r} ({has})")
    obj = getattr(module, src.attr)
    if isinstance(obj, Policy):
        pol = obj
    elif isinstance(obj, type) and issubclass(obj, (Ordering, Queue)):
        if issubclass(obj, Ordering) and obj.key is Ordering.key:
            raise PolicyError(f"{where}: {src.attr} is an Ordering without a key(req, now) method")
        doc = (obj.__doc__ or "").strip().splitlines()
        pol = Policy(src.attr, doc[0] if doc else f"{src.attr} (user policy)", Continuous, obj,
                     params=class_params(obj), cite=str(getattr(obj, "cite", "") or ""))
        _check_bare_class(module, pol, where, src.attr)
    else:
        what = (f"a {type(obj).__name__}" if not isinstance(obj, type)
                else f"the class {obj.__name__}, which is not an Ordering")
        raise PolicyError(f"{where}: {src.attr} is {what}, so not a policy: give a schedport Policy(...) "
                          f"declaration or an Ordering subclass")
    if name is not None and pol.name != name:
        pol = dataclasses.replace(pol, name=name)
    _check_declaration(pol, where, src.attr)
    src = dataclasses.replace(src, name=pol.name)
    return UserPolicy(pol.name, pol.summary, pol.batching, pol.order, pol.admission, dict(pol.params), pol.cite,
                      source=src)


def _check_bare_class(module: types.ModuleType, bare: Policy, where: str, attr: str) -> None:
    """A bare ordering class named as a scheduler runs as `bare` (continuous batching, the class's
    own ``params``). Where its module also declares a `Policy` over that class that would run
    otherwise (other params, batching or gate), the two names would be two schedulers under one
    class, silently: the bare name is then an error that says which name to use."""
    for name, v in vars(module).items():
        if not isinstance(v, Policy) or v.order is not bare.order:
            continue
        what = [w for w, differs in (("params", v.params != bare.params), ("batching", v.batching is not Continuous),
                                     ("admission gate", v.admission is not bare.admission)) if differs]
        if what:
            raise PolicyError(
                f"{where}: {attr} is the ordering of the policy {name} ({v.name!r}), declared with other "
                f"{' and '.join(what)} than the bare class runs with ({bare.params or 'no params'}): name it as "
                f"{Path(where).name}:{name}, or declare those params in {attr}.params so both names are one scheduler")


def _is_policy_like(v) -> bool:
    return isinstance(v, Policy) or (isinstance(v, type) and issubclass(v, (Ordering, Queue))
                                     and v not in (Ordering, Queue))


def _check_declaration(pol: Policy, where: str, attr: str) -> None:
    if not isinstance(pol.name, str) or not NAME_RE.fullmatch(pol.name):
        raise PolicyError(f"{where}: {attr} is named {pol.name!r}; a scheduler name is letters, digits and "
                          f"'.', '_', '+', '-', starting with a letter or digit")
    if pol.name in REGISTRY:
        raise PolicyError(f"{where}: {attr} is named {pol.name!r}, the name of a built-in scheduler; "
                          f"give your policy another name")
    if not (isinstance(pol.batching, type) and issubclass(pol.batching, BatchingMode)):
        raise PolicyError(f"{where}: {attr}'s batching mode {pol.batching!r} is not a BatchingMode "
                          f"(Continuous, StallFree, Selective or Static from schedport.engine.policies.batching)")
    if not callable(pol.order):
        raise PolicyError(f"{where}: {attr}'s order {pol.order!r} is not an Ordering class")
    if not isinstance(pol.params, dict):
        raise PolicyError(f"{where}: {attr}'s params must be a dict, got a {type(pol.params).__name__}")
    _check_params(pol, where, attr)


def _check_params(pol: Policy, where: str, attr: str) -> None:
    """A user policy's `params`, as strictly as an engine config's ``[scheduler.*]`` table: a key is
    an engine parameter (`PARAM_RULES`), whose value must keep its rule, or one its ordering (or
    gate) class declares as its own in a class attribute ``params`` (a dict of defaults). Anything
    else -- a misspelt ``preemtion`` -- would be ignored by the engine, so it is an error; so is an
    own parameter named within a letter or two of an engine parameter."""
    own = class_params(pol.order, pol.admission)
    for key, value in pol.params.items():
        rule = PARAM_RULES.get(key)
        if rule is not None:
            if key != "slo_profile" and not rule[0](value, None):     # slo_profile: checked against the run's config
                raise PolicyError(f"{where}: {attr}'s params {key}: {rule[1]}, got {value!r}")
            continue
        near = difflib.get_close_matches(str(key), PARAM_RULES, n=1, cutoff=0.8)
        if key not in own or near:
            hint = (f"did you mean {near[0]!r}?" if near
                    else f"the engine's parameters are {', '.join(sorted(PARAM_RULES))};")
            raise PolicyError(f"{where}: {attr}'s params has unknown key {key!r}: {hint} a parameter of the policy's "
                              f"own is declared in its ordering class's params (a dict of defaults), under a name "
                              f"apart from the engine's")


def check_scheduler_tables(cfg, policies=()) -> None:
    """Check every ``[scheduler.<name>]`` table of engine config `cfg` against the policy it names:
    a built-in, one of `policies` (the run's own), or an installed one; a table for any other name
    is a one-line error listing them (`validate_scheduler_params` has the rules)."""
    known: dict = dict(REGISTRY)
    for p in policies:
        known[p.name] = p
    missing = [n for n in cfg.scheduler_params if n not in known]
    if missing:
        eps = installed_policies()
        for n in missing:
            if n in eps:
                known[n] = load_entry_point(eps[n])
    validate_scheduler_params(cfg, known)


# ============================================================================ installed packages


def installed_policies() -> dict:
    """The policies installed packages register (entry-point group ``schedport.policies``): {name: entry point}."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _entry_point_named(name: str, src: PolicySource):
    eps = installed_policies()
    if name not in eps:
        raise PolicyError(f"scheduler {name!r}: recorded as entry point {src.spec} "
                          f"({src.distribution or 'a package'}), which is not installed here")
    return eps[name]


def load_entry_point(ep) -> UserPolicy:
    """The policy an installed package registers as entry point `ep`, under the entry point's name."""
    dist = getattr(getattr(ep, "dist", None), "name", None)
    where = f"entry point {ep.name} = {ep.value!r}" + (f" of {dist}" if dist else "")
    if ep.name in REGISTRY:
        raise PolicyError(f"{where}: {ep.name!r} is the name of a built-in scheduler; the package must "
                          f"register its policy under another name")
    mod_name, _, attr = ep.value.partition(":")
    attr = attr.strip()
    if not attr:
        raise PolicyError(f"{where}: expected module:NAME")
    try:
        module = importlib.import_module(mod_name.strip())
    except Exception as e:
        raise PolicyError(f"{where}: importing it raised {type(e).__name__}: {one_line(e)}") from None
    return _user_policy(module, _module_source(module, where, "entry-point", ep.value, attr, dist), name=ep.name)
