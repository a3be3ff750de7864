"""The server's Prometheus ``/metrics`` text: parsed into samples, summed by name and labels."""

from __future__ import annotations

import asyncio
import re

from schedport.realengine.replay import need_aiohttp

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition as (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append((m.group("name"), labels, value))
    return out


def metric(samples, name: str, **match) -> float | None:
    """Sum of the samples of `name` whose labels include `match` (None when absent)."""
    vals = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in match.items())]
    return float(sum(vals)) if vals else None



async def fetch_metrics(session, base: str, timeout_s: float = 10.0) -> list | None:
    aiohttp = need_aiohttp()
    try:
        async with session.get(f"{base}/metrics", timeout=aiohttp.ClientTimeout(total=min(10.0, timeout_s))) as r:
            if r.status != 200:
                return None
            return parse_prometheus(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None



def int_label(labels: dict, key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None
