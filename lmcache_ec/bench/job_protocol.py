"""A measurement job in a process of its own, the parent's side.

The job process (``python -m lmcache_ec.bench.job_process``) reads one job
(JSON) on stdin, writes ``@@progress <text>`` lines on stderr while it runs
and one ``@@result <json>`` line on stdout at the end. Both sides import the
protocol from here, so the job process, which runs every kind of job, and the
benchmarks that start jobs never import each other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

RESULT = "@@result "
PROGRESS = "@@progress "

Progress = Callable[[str], None]


def run_in_worker(
    job: dict[str, Any], env: dict[str, str], timeout: float, progress: Progress
) -> list[dict[str, Any]]:
    """Rows from one job process; RuntimeError with its last error lines on failure."""
    process = subprocess.Popen(
        [sys.executable, "-m", "lmcache_ec.bench.job_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    errors: list[str] = []

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith(PROGRESS):
                progress(line[len(PROGRESS) :].strip())
            elif line.strip():
                errors.append(line.rstrip())
                del errors[:-200]

    output: list[str] = []
    readers = [
        threading.Thread(target=read_stderr, daemon=True),
        threading.Thread(target=lambda: output.extend(process.stdout or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(job))
        process.stdin.close()
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)  # the worker prints its stacks
        time.sleep(1)
        process.kill()
        process.wait()
        readers[0].join(5)
        raise RuntimeError(f"timed out after {timeout:.0f} s; {_main_stack(errors)}") from None
    finally:
        if process.poll() is None:  # interrupted: never leave a job running
            process.kill()
            process.wait()
    for reader in readers:
        reader.join(5)
    for line in output:
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])["rows"]
    last = next((e for e in reversed(errors) if not e.startswith(" ")), "no result")
    raise RuntimeError(f"exit {process.returncode}: {last}")


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
