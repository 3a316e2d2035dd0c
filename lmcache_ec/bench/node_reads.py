"""Node-tier reads: a copy into the reader's own memory next to a mapping of the file.

A node-tier read copies the frame out of shared memory before it is verified
(``tiers/node.py``): nothing the caller holds can then be taken away by a
truncation of the file. The reference is the read it replaced, kept here
only to measure against: a private mapping of the file (no copy), its
payload hashed over the mapping. Both verify the frame the same way
(``codec.decode_read``). Each method reads its own set of entries (cold in
the caches, as a stream of images is), interleaved; ``get`` is the whole
``ECCache.get`` call, on a third set.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import ECCache, codec
from ..codec import FrameRead
from .measure import interleave, summary
from .private_access import node_tier
from .rows import sample_tensors

SHAPES = {"Gemma-3": (256, 2560), "Gemma-3-27B": (256, 5376), "Qwen2.5-VL": (1024, 2048)}
METHODS = ("mapped", "copied", "get")
Progress = Callable[[str], None]


def mapped_read(path: str) -> FrameRead:
    """The frame over a private mapping of its file (the reference)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        view = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return FrameRead(np.frombuffer(view, dtype=np.uint8))


def run_shape(shape: tuple[int, int], n: int, directory: str) -> dict[str, Any]:
    tensors = sample_tensors(shape, torch.bfloat16)
    nbytes = tensors[0].numel() * tensors[0].element_size()
    config = {
        "local_cpu": True,
        "max_local_cpu_size": max(0.05, 4 * nbytes / 1024**3),
        "local_disk": None,
        "node_tier": True,
        "node_dir": directory,
        "max_node_size": 1.2 * len(METHODS) * n * (nbytes + 4096) / 1024**3,
        "namespace": f"bench-node-{shape[0]}x{shape[1]}",
    }
    with ECCache.from_config(config, model="bench/node", dtype=torch.bfloat16) as cache:
        node = node_tier(cache)
        names = {m: [f"{m}-{i}" for i in range(n)] for m in METHODS}
        for method in METHODS:
            for i, name in enumerate(names[method]):
                if not cache.put(name, tensors[i % len(tensors)]):
                    raise RuntimeError(f"the node tier did not take {name}")

        def verified(read: Callable[[Any], FrameRead | None], name: str) -> torch.Tensor:
            key = cache.key(name)
            found = read(key)
            assert found is not None
            return codec.decode_read(found, key).tensor

        def mapped(key: Any) -> FrameRead:
            return mapped_read(node.path_of(key))

        calls = {
            "mapped": lambda i: verified(mapped, names["mapped"][i]),
            "copied": lambda i: verified(node.get_frame, names["copied"][i]),
            "get": lambda i: cache.get(names["get"][i]),
        }

        def check(i: int, out: Any) -> bool:
            return out is not None and torch.equal(out, tensors[i % len(tensors)])

        series = interleave(calls, n, check)
    row: dict[str, Any] = {"shape": list(shape), "bytes": nbytes}
    for method in METHODS:
        row[method] = summary(method, series[method].times, nbytes, hits=series[method].hits)
    row["copied_vs_mapped"] = row["copied"]["median_ms"] / row["mapped"]["median_ms"]
    return row


def run(shapes: dict[str, tuple[int, int]], n: int, progress: Progress) -> list[dict[str, Any]]:
    rows = []
    directory = tempfile.mkdtemp(prefix="ec-bench-node-", dir="/dev/shm")
    try:
        for label, shape in shapes.items():
            progress(f"{label} {shape[0]}x{shape[1]}")
            rows.append({"model": label, **run_shape(shape, n, directory)})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return rows
