"""The test suite's rooms follow the package's data flow: engine/, policies/, workload/, study/,
analysis/, report/, realengine/ and cli/ (tests/test_architecture.py stays at the top: it tests the
whole house). Shared helpers are modules beside this file, importable from every room because
pytest puts this folder on ``sys.path`` for its conftest: `_paths` (the repository, fixtures, the
data mirror), `_engines` (small engine configs), `_cli` (the command line as a user runs it),
`_synthstore` (small results stores), `_vllm` (the vLLM CPU build's interpreter), `_gate` (a
policy that waits for a signal). A few tests reuse another room's fixtures builders (the fake
OpenAI server of ``realengine/test_replay.py``, the variant study of
``analysis/test_simulator_axis.py``): every room is on ``sys.path`` too, so such an import does
not depend on the order in which pytest collects the rooms."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _room in sorted(p for p in _HERE.iterdir() if p.is_dir() and not p.name.startswith(("_", ".", "fixtures"))):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))
