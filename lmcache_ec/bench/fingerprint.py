"""What the weights fingerprint costs (``integration/vllm/weights.py``), on the CPU.

Device tensors are fingerprinted where they live. Three ways are timed on the
same tensors (bfloat16, ``tensors`` of ``elements`` each), interleaved:

- ``sums``: two int64 sums of the raw bits, plain and position-weighted
  (weights 1..65521) — the digest ``mixed_sum`` replaced, kept here only to
  measure against; structured changes cancel in it;
- ``mixed``: ``mixed_sum``, each element's bits times its position's odd
  pseudo-random multiplier, summed modulo 2**64;
- ``host_hash``: a copy of the tensor to fresh host memory (what a device
  tensor would need first) and xxh3-128 over its bytes;
- ``hash``: xxh3-128 alone, what host-resident weights get.

On a GPU the first two are memory-bound kernels: ``bytes_per_element`` says
how many bytes of device memory each moves per element (reads + writes of
its temporaries), from which ``gpu_ms_per_gb`` estimates the time per GB of
bfloat16 weights at ``gpu_bandwidth_gbs``; ``host_hash`` is bound by the
device-to-host link instead (``link_gbs``) plus the hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import xxhash

from ..integration.vllm.weights import MIX_CHUNK, mixed_sum, multipliers
from .measure import summary

_PERIOD = 65521
OLD_CHUNK = 1 << 24


def position_weighted_sums(tensor: torch.Tensor) -> torch.Tensor:
    """[plain, position-weighted] int64 sums of ``tensor``'s raw bits (the reference)."""
    bits = tensor.view(torch.int16).reshape(-1)
    total = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), OLD_CHUNK):
        chunk = bits[start : start + OLD_CHUNK].to(torch.int64)
        weights = torch.arange(start, start + chunk.numel(), device=chunk.device) % _PERIOD + 1
        total[0] += chunk.sum()
        total[1] += (chunk * weights).sum()
    return total


def host_hash(tensor: torch.Tensor) -> bytes:
    copy = torch.empty_like(tensor, device="cpu").copy_(tensor)
    return xxhash.xxh3_128_digest(copy.view(torch.uint8).numpy())


# Device memory each kernel sequence reads and writes per bf16 element:
# sums: to(int64) 2+8, arange 8, % 8+8, +1 8+8, multiply 8+8+8, two sums 8+8.
# mixed: one widening multiply 2+8+8, one sum 8 (the per-chunk scalar work is noise).
BYTES_PER_ELEMENT = {"sums": 2 + 8 + 8 + 16 + 16 + 24 + 16, "mixed": 2 + 8 + 8 + 8}


def run(
    tensors: int, elements: int, repeat: int, gpu_bandwidth_gbs: float, link_gbs: float
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(elements, generator=generator).to(torch.bfloat16) for _ in range(tensors)
    ]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    table = multipliers()
    methods: dict[str, Callable[[torch.Tensor], Any]] = {
        "sums": position_weighted_sums,
        "mixed": lambda w: mixed_sum(w, table),
        "host_hash": host_hash,
        "hash": lambda w: xxhash.xxh3_128_digest(w.view(torch.uint8).numpy()),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for round_ in range(repeat):
        order = list(methods) if round_ % 2 == 0 else list(reversed(methods))
        for name in order:
            started = time.perf_counter()
            for weight in weights:
                methods[name](weight)
            times[name].append(time.perf_counter() - started)
    gb = nbytes / 1e9
    result: dict[str, Any] = {
        "tensors": tensors,
        "elements": elements,
        "bytes": nbytes,
        "mix_chunk": MIX_CHUNK,
        "threads": torch.get_num_threads(),
    }
    for name in methods:
        row = summary(name, times[name], nbytes)
        row["ms_per_gb"] = row["median_ms"] / gb
        result[name] = row
    result["mixed_vs_sums"] = result["mixed"]["median_ms"] / result["sums"]["median_ms"]
    result["host_hash_vs_mixed"] = result["host_hash"]["median_ms"] / result["mixed"]["median_ms"]
    elements_per_gb = 1e9 / 2
    result["gpu_estimate"] = {
        "bandwidth_gbs": gpu_bandwidth_gbs,
        "link_gbs": link_gbs,
        **{
            f"{name}_ms_per_gb": BYTES_PER_ELEMENT[name] * elements_per_gb / gpu_bandwidth_gbs / 1e6
            for name in BYTES_PER_ELEMENT
        },
        "host_hash_ms_per_gb": 1000 / link_gbs + result["hash"]["ms_per_gb"],
        "bytes_per_element": BYTES_PER_ELEMENT,
    }
    return result
