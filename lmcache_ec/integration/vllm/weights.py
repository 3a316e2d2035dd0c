"""A fingerprint of the encoder's weights, as loaded in this worker.

Outputs computed with different encoder weights must never share a key. The
model name, revision and config stay the same when RL or online training
updates weights in place, so the identity also carries this fingerprint,
taken once the model is resident and again after every weight update (see
``weight_updates.py``).

What is hashed: every parameter and buffer of the model outside its language
model (``get_language_model()``, which multimodal vLLM models implement) —
the vision/audio tower, projector, Q-Former… — by name, shape, dtype and
content, so any changed value changes the fingerprint; and the language
model's input embedding table where the encoder output holds rows of it
(``LANGUAGE_EMBEDDINGS_IN_OUTPUT``: an update of the language model alone
changes those outputs). Where the language
model holds every tensor (vLLM's Transformers backend returns a view of the
whole model), what lies outside ``get_mm_mapping()``'s language-model
prefixes is hashed, and without those every tensor: never an empty set.
Content is hashed where the tensor lives: host tensors with xxh3-128 over their raw bytes
(tens of GB/s, no copy); device tensors with ``mixed_sum``, reduced on the
device and brought to the host once, so GPU weights are never copied out.

``mixed_sum`` multiplies each element's raw bits by a pseudo-random odd
64-bit number of its own position (splitmix64 of the position) and adds the
products, wrapping at 2**64. A change of any set of values moves the sum by
the changes weighted with those unrelated multipliers, so structured edits
(a (+1, -2, +1) on neighbours, two values swapped whatever their distance,
a shifted block) cancel only by a 1-in-2**64 accident, unlike plain or
position-weighted sums. The multipliers repeat every ``MIX_CHUNK`` positions,
and each chunk's sum is multiplied again by an odd number of its own index,
so whole chunks cannot trade places either. Integer arithmetic modulo 2**64
is exact and order-free: the same tensor gives the same sum on any device.
Tensor-parallel ranks
hold different shards: each rank's digest is gathered over the group, so
every rank gets the same answer; a rank whose digest failed still joins the
gather, and then every rank fails alike (none waits in it for ever).
Identical weights loaded from different paths give the same fingerprint.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import xxhash

logger = logging.getLogger(__name__)

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MIX_CHUNK = 1 << 20  # positions per multiplier table (8 MB on the device, once per digest)
MIX_GROUP = 16  # chunks per kernel: a 128 MB int64 temporary at most, few launches
_LOGGED: set[str] = set()  # model classes whose whole weights are fingerprinted
# Models whose encoder output holds rows of the language model's own input
# embedding table (vLLM 0.32 and 0.33, inside embed_multimodal): for them that
# table is encoder weights too. Class name (anywhere in the model's MRO) -> whether
# this instance does it. Pinned by tests/upstream/test_vllm_contract.py.
LANGUAGE_EMBEDDINGS_IN_OUTPUT: dict[str, Callable[[torch.nn.Module], bool]] = {
    # timestamp and frame-separator rows between the kept tokens of a pruned video
    "Qwen3VLForConditionalGeneration": lambda m: bool(
        getattr(m, "is_multimodal_pruning_enabled", False)
    ),
    "Molmo2ForConditionalGeneration": lambda m: True,  # every row that is not a patch
    "Moondream3ForCausalLM": lambda m: True,  # each image's BOS row
    "NemotronH_Nano_VL_V2": lambda m: True,  # frame separators of every video
}
_EMBEDDING_MODULES = ("VocabParallelEmbedding", "Embedding")  # not ParallelLMHead


def _language_tensor_ids(model: torch.nn.Module) -> set[int]:
    """ids of the language model's parameters and buffers (empty without one)."""
    getter = getattr(model, "get_language_model", None)
    if not callable(getter):
        return set()
    try:
        language = getter()
    except Exception:  # a model without one: everything counts
        return set()
    if not isinstance(language, torch.nn.Module):
        return set()
    return {id(t) for t in language.parameters()} | {id(t) for t in language.buffers()}


def _outside_language_prefixes(
    model: torch.nn.Module, named: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``named`` less the tensors under ``get_mm_mapping()``'s language-model prefixes."""
    getter = getattr(model, "get_mm_mapping", None)
    if not callable(getter):
        return []
    try:
        prefixes = [p.rstrip(".") for p in getter().language_model if p]
    except Exception:  # no usable mapping: the caller hashes everything
        return []
    if not prefixes:
        return []
    return [
        (name, tensor)
        for name, tensor in named
        if not any(name == p or name.startswith(p + ".") for p in prefixes)
    ]


def _language_embeddings(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The language model's input embedding tables, where the encoder output holds
    rows of them (``LANGUAGE_EMBEDDINGS_IN_OUTPUT``); else none."""
    rule = next(
        (
            LANGUAGE_EMBEDDINGS_IN_OUTPUT[c.__name__]
            for c in type(model).__mro__
            if c.__name__ in LANGUAGE_EMBEDDINGS_IN_OUTPUT
        ),
        None,
    )
    getter = getattr(model, "get_language_model", None)
    if rule is None or not rule(model) or not callable(getter):
        return []
    try:
        language = getter()
    except Exception:  # no language model: nothing was skipped as its own
        return []
    return [
        (f"language_model.{name}.{part}", tensor)
        for name, module in language.named_modules()
        if type(module).__name__ in _EMBEDDING_MODULES
        for part, tensor in module.named_parameters(recurse=False)
    ]


def encoder_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer outside the language model,
    and the language model's input embeddings where the encoder output holds rows
    of them.

    Never an empty set while the model has tensors: when the language model
    covers them all (vLLM's Transformers backend returns a wrapper sharing the
    model's ``_modules``), the language model is found by ``get_mm_mapping()``
    prefixes instead, and failing that every tensor is hashed.
    """
    named = list(model.named_parameters(remove_duplicate=True))
    named += list(model.named_buffers(remove_duplicate=True))
    skip = _language_tensor_ids(model)
    kept = [(name, tensor) for name, tensor in named if id(tensor) not in skip]
    if kept or not named:
        return kept + [(n, t) for n, t in _language_embeddings(model) if id(t) in skip]
    kept = _outside_language_prefixes(model, named)
    if kept:
        return kept
    if type(model).__name__ not in _LOGGED:  # once, not at every weight update
        _LOGGED.add(type(model).__name__)
        logger.error(
            "Encoder weights fingerprint: %s's language model holds every tensor and no "
            "get_mm_mapping() separates the encoder; fingerprinting all its weights",
            type(model).__name__,
        )
    return named


def _raw_bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(_BITS[flat.element_size()])


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 values (wrapping arithmetic)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def multipliers(device: torch.device | str = "cpu") -> torch.Tensor:
    """The odd int64 multiplier of each position in a chunk, on ``device``."""
    with np.errstate(over="ignore"):
        table = _splitmix64(np.arange(MIX_CHUNK, dtype=np.uint64)) | np.uint64(1)
    return torch.from_numpy(table.view(np.int64)).to(device)


def _chunk_keys(count: int) -> np.ndarray:
    """The odd key of each of ``count`` chunks, as int64."""
    with np.errstate(over="ignore"):
        index = np.arange(count, dtype=np.uint64) + np.uint64(MIX_CHUNK)
        return (_splitmix64(index) | np.uint64(1)).view(np.int64)


def mixed_sum(tensor: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
    """The mixed sum of ``tensor``'s raw bits: an int64 scalar on its device.

    ``table``: ``multipliers(tensor.device)``, made once for many tensors.
    Works on any device (CPU, CUDA…) and gives the same value on each.
    """
    bits = _raw_bits(tensor)
    device = bits.device
    if table is None:
        table = multipliers(device)
    chunks = -(-bits.numel() // MIX_CHUNK)
    keys = torch.from_numpy(_chunk_keys(chunks)).to(device)
    total = torch.zeros((), dtype=torch.int64, device=device)
    whole = bits.numel() // MIX_CHUNK
    for first in range(0, whole, MIX_GROUP):
        last = min(first + MIX_GROUP, whole)
        rows = bits[first * MIX_CHUNK : last * MIX_CHUNK].view(-1, MIX_CHUNK)
        # int16/uint8 times int64: the bits widen inside the one multiply kernel.
        sums = (rows * table).sum(dim=1)
        total += (sums * keys[first:last]).sum()
    tail = bits[whole * MIX_CHUNK :]
    if tail.numel():
        total += (tail * table[: tail.numel()]).sum() * keys[whole]
    return total


def local_digest(model: torch.nn.Module) -> bytes:
    """SHA-256 over this process's encoder tensors (names, shapes, dtypes, content)."""
    hasher = hashlib.sha256()
    device_sums = []
    tables: dict[torch.device, torch.Tensor] = {}
    for name, tensor in encoder_tensors(model):
        hasher.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{tensor.device.type};".encode())
        if tensor.numel() == 0:
            continue
        if tensor.device.type == "cpu":
            hasher.update(xxhash.xxh3_128_digest(_raw_bits(tensor).view(torch.uint8).numpy()))
        else:
            if tensor.device not in tables:
                tables[tensor.device] = multipliers(tensor.device)
            device_sums.append(mixed_sum(tensor, tables[tensor.device]))
    if device_sums:  # one transfer to the host for every device tensor
        hasher.update(torch.stack(device_sums).cpu().numpy().tobytes())
    return hasher.digest()


Gather = Callable[[torch.Tensor], torch.Tensor]  # [5] int64 -> [ranks * 5] int64
_DIGEST_WORDS = 4  # a SHA-256 digest as int64s; a fifth word says whether it failed


class FingerprintError(RuntimeError):
    """The fingerprint failed on some tensor-parallel rank (on every rank alike)."""


def weights_fingerprint(
    model: torch.nn.Module | Callable[[], torch.nn.Module], gather: Gather | None = None
) -> str:
    """32 hex characters naming the encoder weights; equal on every TP rank.

    ``model``: the model, or a callable returning it. With ``gather``, a rank
    whose digest fails (a CUDA OOM on the fuller rank) still joins the gather,
    with a failure flag: its peers would otherwise wait in it for ever. Then
    every rank raises ``FingerprintError``.
    """
    if gather is None:
        return _name(local_digest(model if isinstance(model, torch.nn.Module) else model()))
    error: Exception | None = None
    try:
        digest = local_digest(model if isinstance(model, torch.nn.Module) else model())
    except Exception as exc:
        digest, error = bytes(8 * _DIGEST_WORDS), exc
    flag = (error is not None).to_bytes(8, "little")
    local = torch.frombuffer(bytearray(digest + flag), dtype=torch.int64)
    rows = gather(local).cpu().view(-1, _DIGEST_WORDS + 1)
    failed = rows[:, _DIGEST_WORDS].nonzero().flatten().tolist()
    if failed:
        here = f" (here: {error})" if error is not None else ""
        raise FingerprintError(f"failed on tensor-parallel ranks {failed}{here}") from error
    return _name(rows[:, :_DIGEST_WORDS].contiguous().numpy().tobytes())


def _name(digest: bytes) -> str:
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
