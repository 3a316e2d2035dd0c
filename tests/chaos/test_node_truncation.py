"""Node-tier entries truncated under a reader: the reader survives and misses.

Any process that can write the node directory can ``truncate`` an entry (a
``cp`` over it, a cleanup script), and a file on a failing disk reads short.
A read that handed out memory mapped from the file would die of SIGBUS then,
during the read or later when its caller touches the tensor. The reader runs
in a subprocess (``node_victim.py``), once for every test here (~10 s, mostly
imports): a signal fails these tests instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def victim():
    base = tempfile.mkdtemp(prefix="ec-chaos-node-", dir="/dev/shm")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.chaos.node_victim", base],
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR", "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    reports = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            found = json.loads(line)
            reports[found["scenario"]] = found
    return done.returncode, reports, done.stderr


def scenario(victim, name: str) -> dict:
    code, reports, stderr = victim
    if name not in reports:
        cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        pytest.fail(f"the reader died before reporting {name}: {cause}\n{stderr[-3000:]}")
    return reports[name]


def test_the_reader_survives_every_truncation(victim):
    code, _, stderr = victim
    assert code == 0, stderr[-3000:]


def test_a_result_stays_valid_after_its_entry_is_truncated(victim):
    found = scenario(victim, "after_get")
    assert found["exact"]  # the caller's tensor is its own memory
    assert found["again"]  # the truncated entry itself now reads as a miss


def test_staged_results_stay_valid_after_their_entries_are_truncated(victim):
    assert scenario(victim, "after_get_many")["exact"] == [True, True, True]


def test_truncation_before_verification_is_never_a_crash(victim):
    found = scenario(victim, "during_get")
    # Whatever the read had copied whole and verified may be served; never a wrong tensor.
    assert found["result"] in ("miss", "exact")
    assert found["again"]


def test_truncation_between_pieces_of_a_read_is_a_counted_miss(victim):
    found = scenario(victim, "mid_read")
    assert found == {**found, "result": "miss", "counted": 1, "removed": True}
