"""bm25s (and the numba it brings) is imported where BM25 runs, not by a dense command."""

from __future__ import annotations

import subprocess
import sys

from tests.support.fixtures import REPO

COMMANDS = ["encode", "eval", "index", "mine", "score", "search"]


def _imported_after(code: str) -> set[str]:
    """Which of bm25s and numba a fresh interpreter holds after running ``code``."""
    held = "print(' '.join(m for m in ('bm25s', 'numba') if m in sys.modules))"
    probe = f"{code}\nimport sys\n{held}"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_the_commands_import_no_bm25_until_it_runs() -> None:
    imports = "\n".join(f"import dpr_cache.retrieval.drivers.{name}" for name in COMMANDS)
    assert _imported_after(imports) == set()
    # control: the same modules, then one BM25 tokenization, bring it in
    tokenize = "from dpr_cache.retrieval.lexical import bm25_tokens\nbm25_tokens(['a question'])"
    assert "bm25s" in _imported_after(f"{imports}\n{tokenize}")
