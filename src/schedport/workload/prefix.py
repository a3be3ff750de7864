"""A trace's prefix identity at the engine's block size (docs/corpus.md, "Prefix identity in traces").

A trace's ids name blocks of `hash_block_size` prompt tokens (Mooncake: 512); the engine caches
blocks of `engine_block_tokens` (16). `engine_block_keys` gives each full engine block of a
request a key such that two engine blocks may share cached KV only when their keys are equal:
``(id, offset, tokens)``, where `id` names the covering id block, `offset` is the engine block's
place in it and `tokens` is how many prompt tokens that id block holds (`hash_block_size` when it
is full; less for a partial last block, which is then shared only with a request whose last
block has the same id and the same length: the conservative reading, which never invents a hit).
"""

from __future__ import annotations

import numpy as np

from schedport.workload.trace import Trace


def engine_block_keys(trace: Trace, i: int, engine_block_tokens: int = 16) -> list[tuple[int, int, int]]:
    """Keys of request i's full engine blocks, in order: floor(input_tokens / engine_block_tokens)
    of them (only full blocks are cached, as in vLLM). Raises `ValueError` when the trace has no
    ids or its block size is not a multiple of the engine's."""
    if trace.hash_ids is None or trace.hash_block_size is None:
        raise ValueError("this trace carries no hash_ids")
    bs, eb = int(trace.hash_block_size), int(engine_block_tokens)
    if eb < 1 or bs % eb:
        raise ValueError(f"hash_block_size {bs} is not a multiple of the engine's block of {eb} tokens")
    return _keys(trace.hash_ids_of(i), int(trace.input_tokens[i]), bs, eb)


def _keys(ids: np.ndarray, n: int, bs: int, eb: int) -> list[tuple[int, int, int]]:
    """`engine_block_keys` of a request of `n` prompt tokens with block ids `ids` of `bs` tokens."""
    per = bs // eb
    b = np.arange(n // eb)
    j = b // per
    tokens = np.minimum(n - j * bs, bs)
    return list(zip(ids[j].tolist(), (b % per).tolist(), tokens.tolist()))


#: Prompt tokens one id covers when the prefix identity is derived from sessions: the engine's
#: (and vLLM's default) KV block, so an id is exactly one cacheable block (docs/corpus.md).
SESSION_BLOCK_TOKENS = 16
SESSION_ASSUMPTION = "each turn's prompt is the previous turn's prompt and reply plus new tokens"


def session_prefix_ids(session: np.ndarray, prompt: np.ndarray, reply: np.ndarray,
                       block_tokens: int = SESSION_BLOCK_TOKENS) -> tuple[np.ndarray, dict]:
    """Chained block ids derived from conversation turns, assuming `SESSION_ASSUMPTION`.

    Rows are requests in arrival order; `session` holds each one's session id (None: none), and
    `prompt`/`reply` its token counts (>= 1). A request has ceil(prompt / `block_tokens`) ids. The
    first turn of a session, and a request without one, get fresh ids only. A later turn t inherits
    the ids of the previous turn's floor(prompt_{t-1} / block_tokens) full prompt blocks: under the
    assumption those tokens open turn t's prompt. Its other blocks get fresh ids: the previous
    reply's blocks first appear (and are first named) in turn t, and a block straddling the end of
    prompt_{t-1} + reply_{t-1} holds new tokens. A turn whose prompt is shorter than
    prompt_{t-1} + reply_{t-1} contradicts the assumption: it is counted and inherits nothing
    (what it shares is unknown, so no hit is invented), and the next turn builds on it. Fresh ids
    count up from 0 in row order, so the result is deterministic.

    Returns (an object array of int64 id arrays, one per row; the counts: ``requests``,
    ``in_sessions``, ``later_turns``, ``contradicting``, ``shared_blocks``, ``blocks``).
    """
    bs = int(block_tokens)
    n = len(prompt)
    p = np.asarray(prompt, dtype=np.int64)
    r = np.asarray(reply, dtype=np.int64)
    need = -(-p // bs)
    out = np.empty(n, dtype=object)
    last: dict = {}   # session -> row of its latest turn
    nxt = 0
    later = contra = shared = in_s = 0
    for i in range(n):
        s = session[i]
        k = 0
        prev = last.get(s) if s is not None else None
        if s is not None:
            in_s += 1
            last[s] = i
        if prev is not None:
            later += 1
            if p[i] < p[prev] + r[prev]:
                contra += 1
            else:
                k = int(p[prev] // bs)
        fresh = int(need[i]) - k
        ids = np.arange(nxt, nxt + fresh, dtype=np.int64)
        nxt += fresh
        out[i] = np.concatenate((out[prev][:k], ids)) if k else ids
        shared += k
    counts = {"requests": n, "in_sessions": in_s, "later_turns": later, "contradicting": contra,
              "shared_blocks": shared, "blocks": int(need.sum())}
    return out, counts


def session_prefix_record(counts: dict, origin: list[dict],
                          block_tokens: int = SESSION_BLOCK_TOKENS) -> dict:
    """The manifest's record of a prefix identity derived from sessions: labelled an assumption,
    with the rule, the block size, the counts of `session_prefix_ids` and their shares (6 places)."""
    n = max(int(counts["requests"]), 1)
    return {"derived_from": "sessions", "assumed": True, "assumption": SESSION_ASSUMPTION,
            "contradicting_rule": "a turn whose prompt is shorter than the previous prompt + reply "
                                  "contradicts the assumption and shares no block",
            "block_tokens": int(block_tokens), **{k: int(v) for k, v in counts.items()},
            "in_sessions_share": round(counts["in_sessions"] / n, 6),
            "contradicting_share": round(counts["contradicting"] / n, 6),
            "shared_block_share": round(counts["shared_blocks"] / max(int(counts["blocks"]), 1), 6),
            "origin": list(origin)}


_COUNTS = ("requests", "in_sessions", "later_turns", "contradicting", "shared_blocks", "blocks")


def merged_prefix_record(records: list[dict]) -> dict | None:
    """One source's record from its windows' (`session_prefix_record`): windows cut from the same
    files carry the same record, kept once; parts reading other files add their counts. None
    when no window derived its prefix identity."""
    distinct: dict[str, dict] = {}
    for r in records:
        distinct.setdefault(repr(r.get("origin")), r)
    if not distinct:
        return None
    if len(distinct) == 1:
        return dict(next(iter(distinct.values())))
    recs = list(distinct.values())
    counts = {k: sum(int(r[k]) for r in recs) for k in _COUNTS}
    return session_prefix_record(counts, [o for r in recs for o in r.get("origin", [])],
                                 int(recs[0]["block_tokens"]))


def seen_prefix_tokens(trace: Trace, engine_block_tokens: int = 16) -> np.ndarray:
    """Per request, the prompt tokens a prefix cache that never evicts would serve it: the longest
    run of its leading full engine blocks (`engine_block_keys`) that some earlier request of the
    trace (in trace order) had, capped as vLLM caps a hit (at most input_tokens - 1 tokens, whole
    blocks: a fully cached prompt recomputes its last block).

    Computed from the trace alone, independently of the engine: the reference a simulated cache
    is held to at low load, and what `tools/warmup_hit_rate.py` measures a warm-up against when no
    engine with a prefix cache is at hand. It ignores time (a request hits a prefix whose
    prefill has not been scheduled yet) and memory (nothing is ever evicted), so it is the most
    any engine's cache could serve, not what one does.
    """
    eb = int(engine_block_tokens)
    engine_block_keys(trace, 0, eb)          # the checks: ids present, block sizes compatible
    bs, off = int(trace.hash_block_size), trace.hash_offsets()
    seen: set[tuple[int, int, int]] = set()
    out = np.zeros(len(trace), dtype=np.int64)
    for i in range(len(trace)):
        keys = _keys(trace.hash_ids[off[i]:off[i + 1]], int(trace.input_tokens[i]), bs, eb)
        hit = 0
        while hit < len(keys) and keys[hit] in seen:
            hit += 1
        out[i] = min(hit, (int(trace.input_tokens[i]) - 1) // eb) * eb
        seen.update(keys)
    return out
