"""What the job server imports once, before it forks the jobs (``job_protocol.py``).

Imports, and one vLLM config of the shipped tiny model built without a
connector: it imports the model's vLLM and transformers modules, the bulk of
a simulated engine's start. Nothing here starts a Python thread, opens a
connection, or runs torch's thread pools (a job sets its own thread count).
Whatever fails here is only imported later, by the job that needs it, and
fails there as it would have anyway.
"""

from __future__ import annotations

import contextlib
import os

from .job_process import quiet


def _preload() -> None:
    import torch  # noqa: F401
    import vllm.config
    import vllm.distributed.ec_transfer.ec_connector.example_connector
    import vllm.v1.core.sched.scheduler
    import vllm.v1.request
    import vllm.v1.structured_output  # noqa: F401
    from lmcache.v1.config import LMCacheEngineConfig  # noqa: F401
    from lmcache.v1.ec_engine import ECCacheEngine  # noqa: F401

    from ..engine import ECCache  # noqa: F401
    from ..integration.vllm import connector  # noqa: F401
    from . import connector_paths, fleet, fleet_api, local_tiers, remote_tiers, startup, steps  # noqa: F401
    from .subjects import TINY_MODEL_DIR

    steps.sim_vllm_config(TINY_MODEL_DIR, 16, {})


quiet()  # before LMCache and vLLM read their logging settings
# What the imports print (vLLM's platform notes) is of no use to a bench run.
_saved = os.dup(1), os.dup(2)
try:
    with open(os.devnull, "w") as _devnull:
        os.dup2(_devnull.fileno(), 1)
        os.dup2(_devnull.fileno(), 2)
        with contextlib.suppress(Exception):
            _preload()
finally:
    os.dup2(_saved[0], 1)
    os.dup2(_saved[1], 2)
    for _fd in _saved:
        os.close(_fd)
