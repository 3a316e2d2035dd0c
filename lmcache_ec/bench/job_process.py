"""One measurement job in a fresh process: ``python -m lmcache_ec.bench.job_process``.

Reads a job (JSON) on stdin, writes ``@@progress <text>`` lines on stderr
while it runs and one ``@@result <json>`` line on stdout at the end.

Why a process per job: every tier and shape starts from a fresh heap, and
LMCache 0.5.6's ``ECCacheEngine`` cannot be shut down once a remote backend
is configured (``close()`` and interpreter exit wait forever on its event
loop), so the job ends with ``os._exit`` after its result is written.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from typing import Any

from .job_protocol import PROGRESS, RESULT


def progress(text: str) -> None:
    sys.stderr.write(f"{PROGRESS}{text}\n")
    sys.stderr.flush()


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
            from .fleet import run_node

            rows = [run_node(job, progress)]
        elif kind == "fleet-api-node":
            from .fleet_api import run_api_node

            rows = [run_api_node(job, progress)]
        elif kind == "startup":
            from .startup import run_startup

            rows = run_startup(float(job["cpu_gb"]), int(job.get("rounds", 1)), tmp, progress)
        else:
            raise ValueError(f"unknown job {kind!r}")
    return {"rows": rows}


def _quiet() -> None:
    # LMCache logs each upstream put at INFO; silencing it only helps the baseline.
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("lmcache_ec").setLevel(logging.ERROR)


def main() -> None:
    # The parent sends SIGUSR1 before killing a job that overran: its stacks then
    # say where it hung.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _quiet()
    code = 0
    try:
        result = run_job(json.loads(sys.stdin.read()))
        sys.stdout.write(RESULT + json.dumps(result) + "\n")
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
