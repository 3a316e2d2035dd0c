"""Benchmark jobs in processes forked from the job server (``bench/job_protocol.py``).

The first job of the test run starts the server (its imports: 15 to 20 s of
CPU, shared with every bench test after it); each test here then costs a
second or a few.
"""

from __future__ import annotations

import os
import time

import pytest

from lmcache_ec.bench.job_protocol import run_in_worker


def test_each_job_is_a_new_process_with_the_environment_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("LMCACHE_EC_BENCH_PROBE", "set after the job server started")
    names = ["LMCACHE_EC_BENCH_PROBE", "LMCACHE_EC_BENCH_EXTRA"]
    probe = {"job": "probe", "env": names}
    run_in_worker(probe, {}, 120, lambda _: None)  # the job server is running from here on
    monkeypatch.setenv("LMCACHE_EC_BENCH_PROBE", "changed since")
    (first,) = run_in_worker(probe, {"LMCACHE_EC_BENCH_EXTRA": "for this job"}, 120, lambda _: None)
    (second,) = run_in_worker(probe, {}, 120, lambda _: None)
    assert first["env"] == {
        "LMCACHE_EC_BENCH_PROBE": "changed since",
        "LMCACHE_EC_BENCH_EXTRA": "for this job",
    }
    assert second["env"] == {
        "LMCACHE_EC_BENCH_PROBE": "changed since",
        "LMCACHE_EC_BENCH_EXTRA": None,
    }
    assert len({first["pid"], second["pid"], os.getpid()}) == 3


def test_a_job_sends_progress_and_rows(tmp_path):
    seen: list[str] = []
    job = {"job": "cpu", "shape": [4, 8], "iterations": 2, "batch": 2, "dir": str(tmp_path)}
    rows = run_in_worker(job, {}, 120, seen.append)
    assert {"put", "get"} <= {row["op"] for row in rows}
    assert {"put", "get"} <= set(seen)  # progress lines, as the job went


def test_a_failing_job_names_its_error():
    with pytest.raises(RuntimeError, match="exit 1: ValueError: unknown job 'tape'"):
        run_in_worker({"job": "tape"}, {}, 120, lambda _: None)


def _fails_then_lingers(job, env, connection, output) -> None:
    """A job process that reports its error, closes its pipe, and takes a while to exit."""
    with open(output, "a") as stream:
        stream.write("ValueError: planted failure\n")
    connection.close()
    time.sleep(0.5)  # still exiting when the parent sees the pipe close
    os._exit(3)


def test_a_job_still_exiting_after_its_pipe_closed_keeps_its_own_status(monkeypatch):
    # The forked target is found by name in the job server: this module's function.
    from lmcache_ec.bench import job_process

    monkeypatch.setattr(job_process, "run_forked", _fails_then_lingers)
    with pytest.raises(RuntimeError, match=r"^exit 3: ValueError: planted failure$"):
        run_in_worker({"job": "never-run"}, {}, 120, lambda _: None)


def test_an_overrunning_job_is_stopped_and_shows_where_it_waited(redis_url):
    """A fleet node whose partner never comes waits at the barrier; the parent
    stops it at its timeout and says where it was."""
    job = {
        "job": "fleet-node",
        "run": "fleet-alone",
        "node": 0,
        "nodes": 2,  # the other node is never started
        "stream": ["a"],
        "ec": {"max_local_cpu_size": 0.01, "namespace": "fleet-alone"},
        "claims": {},
        "shape": [4, 8],
        "interval_ms": 1,
        "encode_ms": 1,
        "forward_ms": 1,
        "barrier_url": redis_url,
    }
    started = time.monotonic()
    # The main thread's innermost frames: the barrier's Redis polling.
    with pytest.raises(RuntimeError, match=r"timed out after 8 s; stack: File "):
        run_in_worker(job, {}, 8, lambda _: None)
    assert time.monotonic() - started < 60  # stopped, not waited for
