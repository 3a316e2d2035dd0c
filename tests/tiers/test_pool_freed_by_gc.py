"""A pool buffer the garbage collector frees inside LMCache's stats lock stalls nobody.

LMCache's stats methods hold one process-wide lock, and freeing a pool buffer
calls one of them. A buffer dropped in a reference cycle is freed by the
collector (``MemoryObj.__del__``), which can run inside one of those methods,
in the thread that holds the lock: that thread used to wait on itself for
good (seen as a 300 s hang of ``bench steps``). Run in a child process, so a
thread stuck on the lock cannot reach the rest of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 120  # the child's import and start on a loaded machine; a deadlock is for ever

CHILD = textwrap.dedent(
    """
    import gc, os, sys, threading, torch
    import lmcache.utils
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache_ec import ECCache
    cache = ECCache.from_config({"local_cpu": True, "max_local_cpu_size": 0.05}, model="m")
    pool = cache._storage.storage_backends["LocalCPUBackend"].memory_allocator
    buffer = pool.allocate(torch.Size([4096]), torch.uint8, MemoryFormat.EC_TD)
    cycle = [buffer]
    cycle.append(cycle)  # only the collector can free it
    del buffer, cycle
    gc.disable()

    def stats_method_collecting():  # an allocation inside it starts a collection
        with lmcache.utils._shared_observability_lock:
            gc.collect()

    thread = threading.Thread(target=stats_method_collecting, daemon=True)
    thread.start()
    thread.join(10)
    print("stalled" if thread.is_alive() else "freed", flush=True)
    os._exit(0)
    """
)


def test_a_buffer_freed_by_the_collector_inside_the_stats_lock_stalls_nobody():
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
        timeout=BOUND_S,
    )
    assert child.stdout.strip() == "freed", child.stderr[-3000:]
