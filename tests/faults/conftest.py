"""With ``DPR_CACHE_FAULT_REPORT=PATH`` the injections the fault tests recorded are appended there
as JSON lines at the end of the session (``python -m tests.faults.report PATH`` turns them into
docs/reliability.md)."""

from __future__ import annotations

import json
import os

import pytest

from tests.faults.inject import RECORDS


@pytest.fixture(scope="session", autouse=True)
def _report():
    yield
    target = os.environ.get("DPR_CACHE_FAULT_REPORT")
    if target and RECORDS:
        with open(target, "a", encoding="utf-8") as f:
            for r in RECORDS:
                f.write(json.dumps(r) + "\n")
