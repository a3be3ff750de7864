"""A sweep's progress: a rich display on a terminal, plain lines in a log or a pipe."""

from __future__ import annotations

import math
import time

#: Seconds between two progress lines when the output is not a terminal (a log, a pipe).
PROGRESS_SECONDS = 5.0


class PlainProgress:
    """Progress as plain lines for a log or a pipe: ``runs: 1200/9360 (12.8%), 17.3 runs/s,
    elapsed 1 min 09 s, ETA 7 min 52 s`` at most every `every` seconds while a task advances,
    and once when it completes. Same calls as the rich display (`add_task`, `advance`,
    `refresh`), so the sweep drives either."""

    def __init__(self, console, every: float = PROGRESS_SECONDS, clock=time.monotonic):
        self.console, self.every, self.clock = console, every, clock
        self.tasks: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, total: int) -> int:
        """Start counting a task of `total` units; returns its id."""
        now = self.clock()
        self.tasks.append({"desc": description, "total": int(total), "done": 0, "t0": now, "last": now})
        return len(self.tasks) - 1

    def advance(self, task: int, n: int = 1) -> None:
        """Count `n` more units done; print a line if one is due."""
        t = self.tasks[task]
        t["done"] += n
        if t["done"] >= t["total"] or self.clock() - t["last"] >= self.every:
            self._line(t)

    def refresh(self) -> None:
        """Print a line for each unfinished task whose interval has passed (called while idle)."""
        for t in self.tasks:
            if t["done"] < t["total"] and self.clock() - t["last"] >= self.every:
                self._line(t)

    def _line(self, t: dict) -> None:
        now = self.clock()
        t["last"] = now
        el = now - t["t0"]
        rate = t["done"] / el if el > 0 else math.nan
        left = t["total"] - t["done"]
        pct = 100.0 * t["done"] / t["total"] if t["total"] else 100.0
        eta = "done" if left <= 0 else (f"ETA {fmt_wall(left / rate)}" if rate > 0 else "ETA unknown")
        rate_s = f"{rate:.1f} {t['desc']}/s" if math.isfinite(rate) else f"-- {t['desc']}/s"
        self.console.print(f"{t['desc']}: {t['done']}/{t['total']} ({pct:.1f}%), {rate_s}, "
                           f"elapsed {fmt_wall(el)}, {eta}", markup=False, highlight=False, soft_wrap=True)


def progress_display(enabled: bool, console=None, every: float = PROGRESS_SECONDS):
    """A rich progress display (description, bar, done/total, runs/s, elapsed and ETA) on a
    terminal; `PlainProgress` lines every `every` seconds when the output is not a terminal."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task):
            speed = task.finished_speed or task.speed
            return Text("-- runs/s" if not speed else f"{speed:.1f} runs/s", style="progress.data.speed")

    console = console or Console(stderr=True)
    if enabled and not console.is_terminal:
        return PlainProgress(console, every)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, disable=not enabled)


def fmt_wall(s: float) -> str:
    """A wall time for people: ``12.3 s`` under a minute, else ``7 min 52 s``."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s"
