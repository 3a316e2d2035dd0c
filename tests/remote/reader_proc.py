"""Process B of the sharing tests: read entries with an empty local tier.

Reads a JSON request on stdin (``config``, ``model``, ``hashes``) and prints
one JSON line: for each hash the tier that answered and the SHA-256 of
dtype, shape and bytes of the tensor (or null on a miss).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")


def fingerprint(tensor) -> str:
    digest = hashlib.sha256(f"{tensor.dtype}|{list(tensor.shape)}|".encode())
    digest.update(tensor.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    from lmcache_ec import ECCache

    request = json.load(sys.stdin)
    results = []
    with ECCache.from_config(request["config"], model=request["model"]) as cache:
        for mm_hash in request["hashes"]:
            tier = cache.contains(mm_hash)
            tensor = cache.get(mm_hash)
            results.append(
                {"tier": tier, "fingerprint": None if tensor is None else fingerprint(tensor)}
            )
        stats = cache.stats.snapshot()
    print(json.dumps({"results": results, "hits": stats["hits"]}))


if __name__ == "__main__":
    main()
