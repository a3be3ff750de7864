"""Where the tests find the repository, their fixture files and the public data mirror."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
#: the public data mirror beside the checkout (../shared/datasets)
MIRROR = REPO.parent / "shared" / "datasets"
