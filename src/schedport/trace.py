"""The canonical trace: one row per request, held as columnar numpy arrays.

Columns: `arrival_s` (float seconds from window start, non-decreasing),
`input_tokens` (int >= 1), `output_tokens` (int >= 1), `client_id` (optional string).
Every public format is converted into this by an adapter; the engine reads only this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "client_id")
REQUIRED = ("arrival_s", "input_tokens", "output_tokens")


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated request trace (immutable columnar arrays).

    `client_id` is an object array of str (or None for requests without a client),
    or None when the trace has no client column at all.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    client_id: np.ndarray | None = None
    name: str = "trace"

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival (0 for a one-request trace)."""
        if len(self) == 0:
            return 0.0
        return float(self.arrival_s[-1] - self.arrival_s[0])

    def scaled(self, factor: float) -> "Trace":
        """The same requests with every arrival time multiplied by `factor` (burst shape kept)."""
        return Trace(self.arrival_s * float(factor), self.input_tokens, self.output_tokens,
                     self.client_id, self.name)
