"""The schema of ``portability.json``: its version, and a check of a file against the structure.

The structure is a JSON Schema file shipped in the package (``analysis/data/portability.schema.json``,
draft 2020-12), written in the small subset of the standard that `schema_error` checks: ``type``,
``required``, ``properties``, ``additionalProperties``, ``items``, ``anyOf``, ``enum``, ``const``,
``pattern``, ``minimum``, ``maximum`` and ``$ref`` to ``#/$defs/...`` (annotations such as
``description`` are skipped). A schema keyword outside the subset is refused when the schema is
read, so nothing in the file goes unchecked unnoticed. The subset needs no dependency; any
standard validator reads the same file (the tests check that one agrees where installed).

The version is ``schedport.portability/<major>``. A reader refuses a major version it does not
know (`check_version`), with one line, rather than failing later on a field that moved.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

from schedport.errors import SchedportError

#: The prefix of every portability.json's ``schema`` value.
SCHEMA_PREFIX = "schedport.portability/"
#: The major version this code writes and reads; a change to a key the schema lists raises it.
SCHEMA_MAJOR = 2
#: The ``schema`` value written into portability.json.
SCHEMA_VERSION = f"{SCHEMA_PREFIX}{SCHEMA_MAJOR}"

#: The JSON Schema keywords `schema_error` checks, and the annotations it skips.
CHECKED = frozenset({"type", "required", "properties", "additionalProperties", "items", "anyOf", "enum", "const",
                     "pattern", "minimum", "maximum", "$ref"})
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "x-schema-major"})

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(v: Any, name: str) -> bool:
    """JSON Schema's types of a parsed JSON value (a bool is no number; 1.0 is no integer here,
    as json.dumps writes every float with a point)."""
    if name == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if name == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, _TYPES[name])


def _json_type(v: Any) -> str:
    """The JSON type name of a parsed value, for a message (the value itself is never echoed)."""
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is_type(v, name):
            return name
    return type(v).__name__


def _known_keywords(s: Any, where: str = "") -> None:
    """Refuse a schema that uses a keyword outside the checked subset (it would pass unchecked)."""
    if isinstance(s, dict):
        for k, v in s.items():
            if k not in CHECKED and k not in ANNOTATIONS:
                raise SchedportError(f"portability schema: keyword {k!r} at {where or '/'} is not one schedport "
                                     "checks")
            if k in ("properties", "$defs"):
                for name, sub in v.items():
                    _known_keywords(sub, f"{where}/{k}/{name}")
            elif k in ("items", "additionalProperties"):
                _known_keywords(v, f"{where}/{k}")
            elif k == "anyOf":
                for i, sub in enumerate(v):
                    _known_keywords(sub, f"{where}/anyOf/{i}")


@lru_cache(maxsize=1)
def portability_schema() -> dict:
    """The shipped JSON Schema of portability.json (read once; its keywords checked)."""
    text = resources.files("schedport.analysis").joinpath("data", "portability.schema.json").read_text()
    schema = json.loads(text)
    _known_keywords(schema)
    return schema


def _resolve(root: dict, ref: str) -> dict:
    """The sub-schema a local ``$ref`` (``#/$defs/name``) names."""
    if not ref.startswith("#/"):
        raise SchedportError(f"portability schema: only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check_object(v: dict, s: dict, root: dict, path: str) -> Optional[str]:
    """The object keywords: required keys, each listed property, the other keys."""
    for k in s.get("required", ()):
        if k not in v:
            return f"{path or '/'}: the key {k!r} is missing"
    props = s.get("properties", {})
    extra = s.get("additionalProperties", True)
    for k, x in v.items():
        if k in props:
            err = schema_error(x, props[k], root, f"{path}/{k}")
        elif extra is False:
            err = f"{path or '/'}: the key {k!r} is not allowed"
        elif isinstance(extra, dict):
            err = schema_error(x, extra, root, f"{path}/{k}")
        else:
            err = None
        if err:
            return err
    return None


def schema_error(v: Any, s: dict, root: Optional[dict] = None, path: str = "") -> Optional[str]:
    """The first place where the parsed JSON value `v` breaks schema `s` (``"/json/pointer: why"``),
    or None when it conforms. `root` holds the ``$defs`` that ``$ref`` names (default: `s`)."""
    root = s if root is None else root
    if "$ref" in s:
        err = schema_error(v, _resolve(root, s["$ref"]), root, path)
        if err:
            return err
    if "anyOf" in s and all(schema_error(v, sub, root, path) for sub in s["anyOf"]):
        return f"{path or '/'}: a {_json_type(v)} that matches none of the allowed forms"
    if "type" in s:
        names = [s["type"]] if isinstance(s["type"], str) else list(s["type"])
        if not any(_is_type(v, n) for n in names):
            return f"{path or '/'}: a {_json_type(v)} where {' or '.join(names)} is expected"
    if "enum" in s and v not in s["enum"]:
        return f"{path or '/'}: not one of the allowed values"
    if "const" in s and v != s["const"]:
        return f"{path or '/'}: not the required value"
    if "pattern" in s and isinstance(v, str) and not re.search(s["pattern"], v):
        return f"{path or '/'}: does not match the pattern {s['pattern']!r}"
    if _is_type(v, "number"):
        if "minimum" in s and v < s["minimum"]:
            return f"{path or '/'}: below the minimum {s['minimum']}"
        if "maximum" in s and v > s["maximum"]:
            return f"{path or '/'}: above the maximum {s['maximum']}"
    if isinstance(v, dict):
        return _check_object(v, s, root, path)
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            err = schema_error(x, s["items"], root, f"{path}/{i}")
            if err:
                return err
    return None


def check_version(res: Any, where) -> int:
    """The major schema version of a portability dict read from `where`; a dict that is not a
    schedport portability.json, or one of a major version this code does not read, is a
    one-line `SchedportError`."""
    version = res.get("schema") if isinstance(res, dict) else None
    if not isinstance(version, str) or not version.startswith(SCHEMA_PREFIX):
        raise SchedportError(f"{where}: not a schedport portability.json (no 'schema' of schedport.portability)")
    major = version[len(SCHEMA_PREFIX):].split(".")[0]
    if not major.isdigit() or int(major) != SCHEMA_MAJOR:
        shown = major if major.isdigit() else "unknown"
        raise SchedportError(f"{where}: portability.json of schema major version {shown}, but this schedport reads "
                             f"version {SCHEMA_MAJOR}; analyse the store again with this version")
    return int(major)


def check_portability(res: Any, where) -> None:
    """Refuse (one-line `SchedportError`) a portability dict read from `where` whose version this
    code does not read or whose structure breaks the shipped schema."""
    check_version(res, where)
    err = schema_error(res, portability_schema())
    if err:
        raise SchedportError(f"{where}: not a valid portability.json at {err}")
