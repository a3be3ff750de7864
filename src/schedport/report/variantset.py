"""How the report names the variant set a store was run with (portability.json's ``set`` of the
``simulator`` and ``deployments`` blocks): shipped with schedport, or a user's file with the set's
digest, so that a user's set is never described as the shipped one of the same name."""

from __future__ import annotations

__all__ = ["set_is_shipped", "set_origin"]


def set_is_shipped(s: dict) -> bool:
    """Whether the variant set recorded in a ``simulator`` or ``deployments`` block is the one
    schedport ships under its name (``set.shipped``; an analysis written before that field
    existed: its source says so)."""
    if "shipped" in s:
        return s["shipped"] is True
    return s.get("source") == f"shipped:{s.get('name')}"


def set_origin(s: dict) -> str:
    """Where a recorded variant set comes from, in words: shipped with schedport, or the file it
    was read from and the set's digest (sha256 of its name, version and variants)."""
    name, version = s.get("name"), s.get("version")
    if set_is_shipped(s):
        return f"the set {name} version {version} shipped with schedport"
    src = s.get("source")
    where = (f"recorded as {src}, which is not the set this schedport ships under that name"
             if isinstance(src, str) and src.startswith("shipped:") else f"read from the file {src}")
    digest = s.get("digest")
    return (f"the set {name} version {version}, {where}"
            + (f" (set digest sha256 {digest[:12]})" if isinstance(digest, str) and digest else ""))
