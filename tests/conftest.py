"""Fixtures for every test: no hub at all (the tests and their child processes run offline,
whatever the environment says; a test that needs the network path sets it for its own child),
every cache the suite's commands would write under the home folder (dpr-cache's Arrow and BM25
caches, matplotlib's, the datasets library's) in a temporary folder removed at the end,
OpenMP threads that sleep rather than spin while they wait, each test's changes to the
environment undone, the environment as collected taken for the fork server's, and float64 as
the default dtype on demand.

Shared helpers live in :mod:`tests.support` (tiny BERT, random inputs, the CLI runner);
fixtures of one folder live in that folder's conftest.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
os.environ.update(OFFLINE)  # before anything imports huggingface_hub, which reads it once
# Nothing the suite writes lands under the home folder: the caches a command defaults to there
# go to a temporary folder of this process (and its children), removed when it ends.
CACHES = tempfile.mkdtemp(prefix="dpr-cache-tests-")
atexit.register(shutil.rmtree, CACHES, ignore_errors=True)
HOME_CACHES = {
    "XDG_CACHE_HOME": CACHES,  # dpr-cache's default data.cache_dir: $XDG_CACHE_HOME/dpr-cache
    "MPLCONFIGDIR": os.path.join(CACHES, "matplotlib"),
    "HF_DATASETS_CACHE": os.path.join(CACHES, "datasets"),
}
os.environ.update(HOME_CACHES)
# The tests run two at a time on two cores (pytest -n 2) and start children of their own: an
# OpenMP thread that spins while it waits takes a core from the other process's threads. Idle
# threads sleep instead (read once, when torch loads its OpenMP; children inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def pytest_collection_finish(session):
    """The environment as collected, the test modules' imports done: the fork server's."""
    from tests.support.cli import settle_environment

    settle_environment()


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test leaves this process's environment as it found it. A variable set in passing
    (torch's compiler sets ``TORCHINDUCTOR_CACHE_DIR`` on first use) would otherwise reach every
    later test's commands, and one read as modules are imported sends them all to fresh
    interpreters instead of the fork server (:func:`tests.support.forkserver.may_serve`)."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``DPR_CACHE_TESTS_CPU=FILE``: each test's wall and CPU seconds (its own process, its
    children and the fork server's children) appended to FILE, one JSON object a line."""
    path = os.environ.get("DPR_CACHE_TESTS_CPU")
    if not path:
        yield
        return
    from tests.support.cpu import cpu_seconds, record

    before = cpu_seconds()
    yield
    record(path, item.nodeid, before, cpu_seconds())
