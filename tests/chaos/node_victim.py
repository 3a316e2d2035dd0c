"""A process that reads node-tier entries while their files are truncated.

Run by ``test_node_truncation.py`` in a subprocess, so that a read which dies
of SIGBUS ends this process, not pytest. Prints one JSON line per scenario,
in order; a scenario that killed the process prints nothing.

    python -m tests.chaos.node_victim NODE_DIR
"""

from __future__ import annotations

import json
import os
import sys

import torch

from lmcache_ec import ECCache, codec
from tests.conftest import bit_equal, make_tensor

GEMMA = (256, 2560)  # 1.3 MB frames: one read piece
QWEN = (1024, 2048)  # 4.2 MB frames: read in 2 MB pieces


def report(scenario: str, **fields) -> None:
    print(json.dumps({"scenario": scenario, **fields}), flush=True)


def main(node_dir: str) -> None:
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": node_dir,
        "max_node_size": 0.1,
        "namespace": "chaos",
    }
    with ECCache.from_config(config, model="m", dtype=torch.bfloat16) as cache:
        node = cache._storage.storage_backends["NodeBackend"]

        def path(mm_hash: str) -> str:
            return node.path_of(cache.key(mm_hash))

        def failures() -> int:
            return cache.stats.snapshot()["integrity_failures"]

        # The caller holds the result when the file is truncated, then reads it.
        tensor = make_tensor(GEMMA, torch.bfloat16, seed=1)
        assert cache.put("after", tensor)
        out = cache.get("after")
        os.truncate(path("after"), 0)
        report("after_get", exact=bit_equal(out, tensor), again=cache.get("after") is None)

        tensors = {f"many-{i}": make_tensor(GEMMA, torch.bfloat16, seed=10 + i) for i in range(3)}
        assert all(cache.put_many(tensors))
        outs = cache.get_many(list(tensors))  # what the worker stages on a CPU engine
        for mm_hash in tensors:
            os.truncate(path(mm_hash), 0)
        exact = [bit_equal(o, t) for o, t in zip(outs, tensors.values(), strict=True)]
        report("after_get_many", exact=exact)

        # Truncated between the read of the file and the payload's verification.
        tensor = make_tensor(GEMMA, torch.bfloat16, seed=2)
        assert cache.put("during", tensor)
        decode = codec.decode_read

        def truncate_then_decode(read, key):
            os.truncate(node.path_of(key), 0)
            return decode(read, key)

        codec.decode_read = truncate_then_decode
        try:
            out = cache.get("during")
        finally:
            codec.decode_read = decode
        report(
            "during_get",
            result="miss" if out is None else ("exact" if bit_equal(out, tensor) else "WRONG"),
            again=cache.get("during") is None,
        )

        # Truncated while the frame is being read, between two of its pieces.
        tensor = make_tensor(QWEN, torch.bfloat16, seed=3)
        assert cache.put("mid-read", tensor)
        before = failures()
        preadv = os.preadv
        reads: list[int] = []

        def truncate_after_first_piece(fd, buffers, offset):
            got = preadv(fd, buffers, offset)
            reads.append(got)
            if len(reads) == 1:
                os.truncate(path("mid-read"), 4096)
            return got

        os.preadv = truncate_after_first_piece
        try:
            out = cache.get("mid-read")
        finally:
            os.preadv = preadv
        report(
            "mid_read",
            result="miss" if out is None else ("exact" if bit_equal(out, tensor) else "WRONG"),
            counted=failures() - before,
            removed=not os.path.exists(path("mid-read")),
        )


if __name__ == "__main__":
    main(sys.argv[1])
