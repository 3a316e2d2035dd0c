"""A fingerprint of the encoder's weights, as loaded in this worker.

Outputs computed with different encoder weights must never share a key. The
model name, revision and config stay the same when RL or online training
updates weights in place, so the identity also carries this fingerprint,
taken once the model is resident and again after every weight update (see
``seams.py``).

What is hashed: every parameter and buffer of the model outside its language
model (``get_language_model()``, which multimodal vLLM models implement) —
the vision/audio tower, projector, Q-Former… — by name, shape, dtype and
content, so any changed value changes the fingerprint. Content is hashed
where the tensor lives: host tensors with xxh3-128 over their raw bytes
(tens of GB/s, no copy); device tensors with two exact integer sums of their
raw bits (plain and position-weighted), reduced on the device and brought to
the host once, so GPU weights are never copied out. Tensor-parallel ranks
hold different shards: each rank's digest is gathered over the group, so
every rank gets the same answer. Identical weights loaded from different
paths give the same fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import xxhash

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 24  # elements per reduction: bounds the int64 temporaries
_PERIOD = 65521  # position weights 1..65521 (a prime: shifts change the sum)


def encoder_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer outside the language model."""
    language = None
    getter = getattr(model, "get_language_model", None)
    if callable(getter):
        try:
            language = getter()
        except Exception:  # a model without one: everything counts
            language = None
    skip: set[int] = set()
    if isinstance(language, torch.nn.Module):
        skip = {id(t) for t in language.parameters()} | {id(t) for t in language.buffers()}
    for name, tensor in model.named_parameters(remove_duplicate=True):
        if id(tensor) not in skip:
            yield name, tensor
    for name, tensor in model.named_buffers(remove_duplicate=True):
        if id(tensor) not in skip:
            yield name, tensor


def _raw_bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(_BITS[flat.element_size()])


def _device_sums(tensor: torch.Tensor) -> torch.Tensor:
    """[plain, position-weighted] int64 sums of ``tensor``'s raw bits (wrapping)."""
    bits = _raw_bits(tensor)
    total = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start : start + _CHUNK].to(torch.int64)
        weights = torch.arange(start, start + chunk.numel(), device=chunk.device) % _PERIOD + 1
        total[0] += chunk.sum()
        total[1] += (chunk * weights).sum()
    return total


def local_digest(model: torch.nn.Module) -> bytes:
    """SHA-256 over this process's encoder tensors (names, shapes, dtypes, content)."""
    hasher = hashlib.sha256()
    device_sums = []
    for name, tensor in encoder_tensors(model):
        hasher.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{tensor.device.type};".encode())
        if tensor.numel() == 0:
            continue
        if tensor.device.type == "cpu":
            hasher.update(xxhash.xxh3_128_digest(_raw_bits(tensor).view(torch.uint8).numpy()))
        else:
            device_sums.append(_device_sums(tensor))
    if device_sums:  # one transfer to the host for every device tensor
        hasher.update(torch.stack(device_sums).cpu().numpy().tobytes())
    return hasher.digest()


Gather = Callable[[torch.Tensor], torch.Tensor]  # [4] int64 -> [ranks * 4] int64


def weights_fingerprint(model: torch.nn.Module, gather: Gather | None = None) -> str:
    """32 hex characters naming the encoder weights; equal on every TP rank."""
    digest = local_digest(model)
    if gather is not None:
        local = torch.frombuffer(bytearray(digest), dtype=torch.int64)
        digest = gather(local).cpu().numpy().tobytes()
    return hashlib.sha256(digest).hexdigest()[:32]


def tp_gather() -> Gather | None:
    """All-gather over this worker's tensor-parallel group, or None with one rank."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized
    except ImportError:
        return None
    if not model_parallel_is_initialized():
        return None
    group = get_tp_group()
    if group.world_size == 1:
        return None

    def gather(local: torch.Tensor) -> torch.Tensor:
        out: Any = group.all_gather(local.to(group.device), dim=0)
        return out

    return gather
