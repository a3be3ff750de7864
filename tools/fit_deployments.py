#!/usr/bin/env python3
"""Fit the deployment profiles from Vidur's published profiles and embed them in the package.

Reads ``../shared/calibration/vidur-profiles`` (relative to the repository root; ``--dir`` to
override), checks every file against its ``SHA256SUMS``, fits each deployment of
`schedport.engine.core.deployments.DEPLOYMENT_SPECS` (`schedport.engine.core.profilefit.fit_all`) and
writes ``src/schedport/engine/core/data/deployments.json``. ``--check`` writes nothing and exits 1 if
the embedded file differs from a fresh fit. Every problem with a profile file is one line and
exit 2.

Usage:  .venv/bin/python tools/fit_deployments.py [--dir DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from schedport.engine.core.profilefit import ProfileError, fit_all

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO.parent / "shared" / "calibration" / "vidur-profiles"
OUT = REPO / "src" / "schedport" / "engine" / "core" / "data" / "deployments.json"


def main(argv: list[str] | None = None) -> int:
    """Fit, print each deployment's fit errors, and write (or --check) the embedded JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    try:
        fitted = fit_all(args.dir)
    except ProfileError as e:
        print(f"fit_deployments: {e}", file=sys.stderr)
        return 2
    text = json.dumps(fitted, indent=1, sort_keys=True) + "\n"
    for name, d in fitted["deployments"].items():
        f = d["fit"]
        print(f"{name}: non-attention max {f['nonattn_err_pct'][0]}% / mean {f['nonattn_err_pct'][1]}% "
              f"({f['nonattn_points']} points); LM head max {f['lm_head_err_pct'][0]}% / "
              f"mean {f['lm_head_err_pct'][1]}%")
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("embedded deployments.json matches a fresh fit" if same else f"{OUT}: differs from a fresh fit")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
