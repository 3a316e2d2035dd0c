"""A measurement job in a process of its own, the parent's side.

Each job runs in a process forked from one job server (``multiprocessing``'s
forkserver), which imported torch, LMCache, lmcache-ec and vLLM once
(``job_preload.py``): every job starts from the same copy of that process, a
new process each, without paying the imports again (15 to 20 s of CPU per job
that builds a vLLM config). The job sends ``("progress", text)`` and one
``("result", rows)`` over a pipe; its stdout and stderr go to a file, whose
last lines explain a failure.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]

_server_lock = threading.Lock()
_server: Any = None  # the forkserver context, made on first use


def _job_server() -> Any:
    global _server
    with _server_lock:
        if _server is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["lmcache_ec.bench.job_preload"])
            _server = context
        return _server


def run_in_worker(
    job: dict[str, Any], env: dict[str, str], timeout: float, progress: Progress
) -> list[dict[str, Any]]:
    """Rows from one job process; RuntimeError with its last error lines on failure.

    ``env`` is added to this process's environment for the job.
    """
    from .job_process import run_forked  # the target: stdlib imports only

    context = _job_server()
    receive, send = context.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="lmcache-ec-job-") as tmp:
        output = Path(tmp) / "output"  # the job's stdout and stderr
        output.touch()
        process = context.Process(
            target=run_forked,
            args=(job, {**os.environ, **env}, send, str(output)),
            daemon=True,
        )
        process.start()
        send.close()
        result: list[dict[str, Any]] | None = None
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _stop_overrun(process)
                    lines = output.read_text(errors="replace").splitlines()
                    raise RuntimeError(f"timed out after {timeout:.0f} s; {_main_stack(lines)}")
                ready = multiprocessing.connection.wait([receive, process.sentinel], remaining)
                if receive in ready:
                    try:
                        kind, payload = receive.recv()
                    except EOFError:  # every copy of the sending end is closed: it ended
                        break
                    if kind == "progress":
                        progress(payload)
                    else:
                        result = payload
                elif process.sentinel in ready and not receive.poll():
                    break
            process.join(max(1.0, deadline - time.monotonic()))  # it is exiting
        finally:
            if process.is_alive():  # interrupted or timed out: never leave a job running
                process.kill()
            process.join()
            receive.close()
        if result is not None:
            return result
        lines = output.read_text(errors="replace").splitlines()
    last = next((e for e in reversed(lines) if e.strip() and not e.startswith(" ")), "no result")
    raise RuntimeError(f"exit {process.exitcode}: {last}")


def _stop_overrun(process: Any) -> None:
    """SIGUSR1 first: the job writes its threads' stacks (faulthandler)."""
    try:
        os.kill(process.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join()


def _main_stack(lines: list[str]) -> str:
    """The innermost frames of the job's main thread in a faulthandler dump."""
    blocks: list[list[str]] = []
    for line in lines:
        if "(most recent call first)" in line:
            blocks.append([])
        elif blocks and line.strip().startswith("File "):
            blocks[-1].append(line.strip())
    main = [b for b in blocks if any("bench/job_process.py" in frame for frame in b)]
    return "stack: " + " < ".join(main[-1][:4]) if main else "no stack"
