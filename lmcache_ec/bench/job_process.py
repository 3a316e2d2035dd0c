"""One measurement job in a process of its own (``job_protocol.run_in_worker``).

The process is forked from the job server (``job_preload.py``); the job's
progress and result go back over a pipe, its stdout and stderr to a file.

Why a process per job: every tier and shape starts from the same state, and
LMCache 0.5.6's ``ECCacheEngine`` cannot be shut down once a remote backend
is configured (``close()`` and interpreter exit wait forever on its event
loop), so the job ends with ``os._exit`` after its result is sent.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import tempfile
import traceback
from typing import Any

_connection: Any = None  # the pipe to the parent, in a job process


def progress(text: str) -> None:
    _connection.send(("progress", text))


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ..key import SUPPORTED_DTYPES

    torch.set_num_threads(int(job.get("threads", 1)))
    kind = job["job"]
    dtype = SUPPORTED_DTYPES[job.get("dtype", "bfloat16")]
    shape = tuple(job["shape"]) if job.get("shape") else (256, 2560)
    n, batch = int(job.get("iterations", 20)), int(job.get("batch", 4))
    with tempfile.TemporaryDirectory(prefix=f"lmcache-ec-bench-{kind}-", dir=job.get("dir")) as tmp:
        if kind == "cpu":
            from .local_tiers import run_cpu

            rows = run_cpu(shape, dtype, n, batch, progress)  # type: ignore[arg-type]
        elif kind == "disk":
            from .local_tiers import run_disk

            rows = run_disk(shape, dtype, n, batch, tmp, progress)  # type: ignore[arg-type]
        elif kind in ("redis", "s3"):
            from .remote_tiers import run_remote

            rows = run_remote(
                kind,
                shape,  # type: ignore[arg-type]
                dtype,
                n,
                batch,
                progress,
                url=job["url"],
                endpoint_url=job.get("endpoint_url"),
                region=job.get("region"),
            )
        elif kind == "connector":
            from .connector_paths import run_connector

            rows = run_connector(
                shape,  # type: ignore[arg-type]
                dtype,
                int(job.get("items", 1000)),
                n,
                tmp,
                progress,
                remote=job.get("remote"),
                remote_note=job.get("remote_note", ""),
                **({"model_dir": job["model_dir"]} if job.get("model_dir") else {}),
            )
        elif kind == "fleet-node":
            from .fleet_nodes import run_node

            rows = [run_node(job, progress)]
        elif kind == "fleet-api-node":
            from .fleet_nodes import run_api_node

            rows = [run_api_node(job, progress)]
        elif kind == "startup":
            from .startup import run_startup

            rows = run_startup(float(job["cpu_gb"]), int(job.get("rounds", 1)), tmp, progress)
        elif kind == "probe":  # the job process itself, as a job sees it
            names = job.get("env", [])
            rows = [{"pid": os.getpid(), "env": {name: os.environ.get(name) for name in names}}]
        else:
            raise ValueError(f"unknown job {kind!r}")
    return {"rows": rows}


def quiet() -> None:
    """Before anything heavy is imported (the job server calls it first)."""
    # LMCache logs each upstream put at INFO; silencing it only helps the baseline.
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("lmcache_ec").setLevel(logging.ERROR)


def run_forked(job: dict[str, Any], env: dict[str, str], connection: Any, output: str) -> None:
    """The job process: ``job`` with exactly ``env``; never returns."""
    global _connection
    _connection = connection
    fd = os.open(output, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    quiet()
    # The parent sends SIGUSR1 before killing a job that overran: its stacks then
    # say where it hung.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code = 0
    try:
        connection.send(("result", run_job(job)["rows"]))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    connection.close()
    os._exit(code)
