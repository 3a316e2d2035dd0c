"""Entry framing: what every tier stores for one encoder output, and which
tensors can be stored (``validate_tensor``).

LMCache backends move opaque ``uint8`` buffers, so one encoder output travels
as a single self-describing frame and every tier (CPU, disk, Redis, S3) gets
identity and integrity checks for free::

    offset 0   prefix (64 bytes, little-endian)
               magic "LMCECv1\\0" | header_len u32 | flags u32 |
               payload_len u64 | payload xxh3_64 u64 | header xxh3_64 u64 | zeros
    offset 64  header: ASCII JSON (storage name, identity, full mm_hash,
               dtype, shape, created), space-padded to a multiple of 64
    then       payload: the tensor's bytes, C-contiguous, 64-byte aligned

A frame is accepted only if the magic, both checksums, the storage name and
the payload length (= prod(shape) * itemsize) all agree, and a frame read
from a tier (file, Redis, S3) is exactly as long as it declares (prefix +
header + payload, ``check_stored_size``); anything else is
``CorruptEntryError``, which callers turn into a miss plus removal. Tiers
size their reads from the declared length, never from what the store holds,
so a padded entry costs no more memory than the entry it claims to be.
"""

from __future__ import annotations

import json
import math
import struct
import time
import warnings
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, NamedTuple

import numpy as np
import torch
import xxhash

from .key import SUPPORTED_DTYPES, ECKey, EncoderIdentity, dtype_name

MAGIC = b"LMCECv1\x00"
PREFIX = struct.Struct("<8sIIQQQ")
PREFIX_SIZE = 64
ALIGN = 64


class CorruptEntryError(Exception):
    """A stored frame failed verification; ``reason`` says which check."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _pad(size: int) -> int:
    return -size % ALIGN


# The identity's members of a header, JSON-encoded once per identity: a put
# then encodes only what differs per entry.
_IDENTITY_JSON: dict[EncoderIdentity, str] = {}
_IDENTITY_JSON_MAX = 64


def _identity_members(identity: EncoderIdentity) -> str:
    members = _IDENTITY_JSON.get(identity)
    if members is None:
        members = json.dumps(identity.as_dict(), ensure_ascii=True, separators=(",", ":"))[1:-1]
        if len(_IDENTITY_JSON) >= _IDENTITY_JSON_MAX:
            _IDENTITY_JSON.clear()
        _IDENTITY_JSON[identity] = members
    return members


def validate_tensor(tensor: Any, pinned_dtype: str = "") -> None:
    """Raise ``TypeError``/``ValueError`` unless ``tensor`` is storable."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise ValueError(f"expected a dense tensor, got layout {tensor.layout}")
    if tensor.is_nested:  # strided in layout, but no one shape (torch fails at its bytes)
        raise ValueError("expected one dense [tokens, hidden] tensor, got a nested tensor")
    # A ZeroTensor (autograd's) has no memory behind it to store.
    if getattr(tensor, "_is_zerotensor", lambda: False)():
        raise ValueError("a ZeroTensor has no data to store; materialize it (.clone())")
    if tensor.is_meta:
        raise ValueError("meta tensors have no data to store")
    if tensor.dim() != 2:
        raise ValueError(f"expected a 2-D tensor [tokens, hidden], got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"expected a non-empty tensor, got shape {tuple(tensor.shape)}")
    name = dtype_name(tensor.dtype)  # ValueError for unsupported dtypes
    if pinned_dtype and name != pinned_dtype:
        raise ValueError(f"tensor dtype {name} differs from the encoder dtype {pinned_dtype}")


def encode_header(key: ECKey, tensor: torch.Tensor) -> bytes:
    """The padded JSON header for ``tensor`` stored under ``key``: the bytes
    ``json.dumps`` (ASCII, compact) gives for name, identity, mm_hash, dtype,
    shape and creation time, in that order."""
    assert key.identity is not None and key.mm_hash is not None
    members = _identity_members(key.identity)
    shape = ",".join(str(int(d)) for d in tensor.shape)
    raw = (
        f'{{"name":{_json_str(key.storage_name)}{"," if members else ""}{members},'
        f'"mm_hash":{_json_str(key.mm_hash)},"tensor_dtype":{_json_str(dtype_name(tensor.dtype))},'
        f'"shape":[{shape}],"created":{float(round(time.time(), 3))!r}}}'
    ).encode()
    return raw + b" " * _pad(len(raw))


def frame_size(header: bytes, tensor: torch.Tensor) -> int:
    return PREFIX_SIZE + len(header) + tensor.numel() * tensor.element_size()


def write_frame(buffer: torch.Tensor, header: bytes, tensor: torch.Tensor) -> None:
    """Fill ``buffer`` (CPU ``uint8``, ``frame_size`` long) with the frame.

    The payload is copied first (this is where a device tensor comes to the
    host) and checksummed from the buffer itself, so the checksum covers
    exactly the bytes the tiers will store.
    """
    payload_len = tensor.numel() * tensor.element_size()
    start = PREFIX_SIZE + len(header)
    raw = buffer.numpy()  # slicing numpy views costs no torch dispatch
    payload = raw[start : start + payload_len]
    source = host_bytes(tensor)
    if source is not None:
        np.copyto(payload, source)
    else:
        end = start + payload_len
        buffer[start:end].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    prefix = PREFIX.pack(
        MAGIC,
        len(header),
        0,
        payload_len,
        xxhash.xxh3_64_intdigest(payload),
        xxhash.xxh3_64_intdigest(header),
    )
    raw[len(prefix) : PREFIX_SIZE] = 0
    raw[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    raw[PREFIX_SIZE:start] = np.frombuffer(header, dtype=np.uint8)


def frame_payload(buffer: torch.Tensor, header: bytes, tensor: torch.Tensor, name: str) -> Payload:
    """The payload of a frame just written by ``write_frame`` (nothing re-verified)."""
    start = PREFIX_SIZE + len(header)
    length = tensor.numel() * tensor.element_size()
    shape = (tensor.shape[0], tensor.shape[1])
    view = buffer[start : start + length].view(tensor.dtype).view(shape)
    return Payload(name, buffer.numpy()[start : start + length], start, tensor.dtype, shape, view)


def host_bytes(tensor: torch.Tensor) -> np.ndarray | None:
    """A zero-copy byte view of a contiguous CPU tensor, else None.

    Host-to-host copies go through ``np.copyto`` (one memcpy on the calling
    thread): torch's intra-op pool is slower for MB-sized copies and, on a busy
    host, waits for its worker threads to be scheduled.
    """
    # A contiguous tensor may still have a stride other than 1 on a last dim of
    # size 1 (``row.t()``), or a lazy negation: neither can be viewed as bytes.
    if (
        tensor.device.type != "cpu"
        or not tensor.is_contiguous()
        or tensor.stride(-1) != 1
        or tensor.is_neg()
        or tensor.is_conj()
    ):
        return None
    return tensor.detach().view(torch.uint8).numpy().reshape(-1)


def read_prefix(raw: bytes | memoryview) -> tuple[int, int, int, int]:
    """(header_len, payload_len, payload_sum, header_sum); ``CorruptEntryError``."""
    if len(raw) < PREFIX_SIZE:
        raise CorruptEntryError("truncated prefix")
    magic, header_len, _flags, payload_len, payload_sum, header_sum = PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptEntryError("bad magic")
    if header_len % ALIGN:
        raise CorruptEntryError("bad header length")
    return header_len, payload_len, payload_sum, header_sum


def declared_size(raw: bytes | memoryview | np.ndarray) -> int:
    """The bytes the frame whose first ``PREFIX_SIZE`` bytes are ``raw`` declares
    itself to be (prefix + header + payload); ``CorruptEntryError`` if ``raw`` is
    not a frame prefix."""
    header_len, payload_len, _, _ = read_prefix(raw)
    return PREFIX_SIZE + header_len + payload_len


def check_stored_size(raw: bytes | memoryview | np.ndarray, stored: int) -> int:
    """The declared size of the frame whose prefix is ``raw``, if ``stored`` (the
    bytes its tier holds: a file's size, an object's length) equals it.

    The one size rule of every tier: a frame is exactly its prefix, header and
    payload; anything longer or shorter is a damaged entry
    (``CorruptEntryError``), and a read sized from the declared length never
    allocates more than the entry it asked for.
    """
    declared = declared_size(raw)
    if stored != declared:
        raise CorruptEntryError(f"stored size {stored} differs from the declared {declared}")
    return declared


def parse_header(raw: bytes | memoryview, header_sum: int) -> dict[str, Any]:
    if xxhash.xxh3_64_intdigest(raw) != header_sum:
        raise CorruptEntryError("header checksum mismatch")
    return _parse_verified(bytes(raw))


def _parse_verified(raw: bytes) -> dict[str, Any]:
    """The fields of a header whose checksum has been verified."""
    try:
        # Decoded here: json.loads would first guess the bytes' encoding.
        header = json.loads(raw.decode())
        dtype = SUPPORTED_DTYPES[header["tensor_dtype"]]
        shape = list(header["shape"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        # RecursionError: deeply nested JSON (the checksum is no authentication).
        raise CorruptEntryError(f"unreadable header: {exc}") from None
    # Writers store only non-empty 2-D tensors; anything else (negative, zero,
    # float or bool dims) was not written by put and must not reach torch.
    if len(shape) != 2 or not all(type(d) is int and d > 0 for d in shape):
        raise CorruptEntryError(f"bad shape {shape!r:.80}")
    # Readers of ``created`` (listings, purges by age) take it as a number.
    created = header.get("created", 0.0)
    if type(created) not in (int, float) or not math.isfinite(created):
        raise CorruptEntryError(f"bad created {created!r:.80}")
    header["torch_dtype"] = dtype
    header["shape"] = shape
    return header


# Parsed (name, dtype, shape) by exact header bytes: a CPU-tier hit re-reads the
# same header every time, and JSON parsing is a third of the verification cost.
_PARSED: dict[bytes, tuple[str, torch.dtype, tuple[int, ...]]] = {}
_PARSED_MAX = 4096
_PARSED_MAX_LEN = 4096  # a longer header (a huge mm_hash) is parsed each time, not kept


def _header_essentials(raw: np.ndarray, header_sum: int) -> tuple[str, torch.dtype, tuple]:
    """(storage name, dtype, shape) of a header whose checksum is verified here."""
    if xxhash.xxh3_64_intdigest(raw) != header_sum:
        raise CorruptEntryError("header checksum mismatch")
    data = raw.tobytes()
    found = _PARSED.get(data)
    if found is None:
        header = _parse_verified(data)
        found = (header.get("name"), header["torch_dtype"], tuple(header["shape"]))
        if len(data) <= _PARSED_MAX_LEN:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[data] = found
    return found


def _read_header(raw: np.ndarray) -> tuple[dict[str, Any], int, int]:
    """(verified header, payload start, payload_len) of a frame's bytes."""
    header_len, payload_len, payload_sum, header_sum = read_prefix(raw)
    if raw.size < PREFIX_SIZE + header_len:
        raise CorruptEntryError("truncated header")
    header = parse_header(raw[PREFIX_SIZE : PREFIX_SIZE + header_len], header_sum)
    header["payload_sum"] = payload_sum
    return header, PREFIX_SIZE + header_len, payload_len


def read_header(buffer: torch.Tensor) -> dict[str, Any]:
    """The verified header of a frame (payload not checked)."""
    header, start, payload_len = _read_header(buffer.numpy())
    header["payload_len"] = payload_len
    header["frame_len"] = start + payload_len
    return header


class Payload(NamedTuple):  # a tuple: built on every lower-tier read
    """A verified tensor inside a frame; ``data`` and ``tensor`` alias the frame.

    ``owned``: the frame's memory belongs to this read alone (``bytes`` a remote
    store returned, or a disk read's own buffer), so the result may take it
    over instead of copying it.
    """

    name: str  # the storage name the frame was verified for
    data: np.ndarray  # the payload's bytes
    start: int  # payload offset in the frame
    dtype: torch.dtype
    shape: tuple[int, int]
    tensor: torch.Tensor
    owned: bool = False

    def view(self) -> torch.Tensor:
        return self.tensor

    def over(self, buffer: torch.Tensor) -> Payload:
        """The same payload inside ``buffer``, a byte-identical copy of its frame."""
        end = self.start + self.data.size
        tensor = buffer[self.start : end].view(self.dtype).view(self.shape)
        data = buffer.numpy()[self.start : end]
        return Payload(self.name, data, self.start, self.dtype, self.shape, tensor)


def _verify_header(
    raw: np.ndarray, key: ECKey
) -> tuple[str, int, int, int, torch.dtype, tuple[int, int]]:
    """(name, payload start, payload length, payload sum, dtype, shape) of a
    frame whose prefix and header (at least) are in ``raw``; header verified."""
    header_len, payload_len, payload_sum, header_sum = read_prefix(raw)
    start = PREFIX_SIZE + header_len
    if raw.size < start:
        raise CorruptEntryError("truncated header")
    name, dtype, shape = _header_essentials(raw[PREFIX_SIZE:start], header_sum)
    if name != key.storage_name:
        raise CorruptEntryError("entry belongs to another key")
    pinned = key.identity.dtype if key.identity is not None else ""
    if pinned and SUPPORTED_DTYPES[pinned] != dtype:
        raise CorruptEntryError(f"tensor dtype differs from the encoder dtype {pinned}")
    if len(shape) != 2 or math.prod(shape) * dtype.itemsize != payload_len:
        raise CorruptEntryError("shape does not match payload length")
    return name, start, payload_len, payload_sum, dtype, (shape[0], shape[1])


def _verify_payload(data: np.ndarray, length: int, payload_sum: int) -> np.ndarray:
    """The first ``length`` bytes of ``data``, checked against ``payload_sum``."""
    if data.size < length:
        raise CorruptEntryError("truncated payload")
    data = data[:length]
    if xxhash.xxh3_64_intdigest(data) != payload_sum:
        raise CorruptEntryError("payload checksum mismatch")
    return data


def _check_length(raw: np.ndarray, end: int, exact: bool) -> None:
    """``raw`` holds the frame's ``end`` bytes; ``exact``: and nothing more (a
    frame read from a tier; a pool buffer may carry allocator padding)."""
    if raw.size < end:
        raise CorruptEntryError("truncated payload")
    if exact and raw.size != end:
        raise CorruptEntryError(f"stored size {raw.size} differs from the declared {end}")


def _verify(
    raw: np.ndarray, key: ECKey, verify_payload: bool, exact: bool = False
) -> tuple[str, int, int, torch.dtype, tuple[int, int]]:
    """(name, payload start, payload length, dtype, shape) of a verified frame."""
    name, start, length, payload_sum, dtype, shape = _verify_header(raw, key)
    _check_length(raw, start + length, exact)
    if verify_payload:
        _verify_payload(raw[start:], length, payload_sum)
    return name, start, length, dtype, shape


def decode_payload(buffer: torch.Tensor, key: ECKey, *, verify_payload: bool = True) -> Payload:
    """Verify a frame read for ``key``; ``CorruptEntryError`` names the failed check.

    ``verify_payload=False`` skips only the payload checksum (used for frames
    that never left this process's memory).
    """
    raw = buffer.numpy()
    name, start, length, dtype, shape = _verify(raw, key, verify_payload)
    tensor = buffer[start : start + length].view(dtype).view(shape)
    return Payload(name, raw[start : start + length], start, dtype, shape, tensor)


def decode_bytes(data: bytes, key: ECKey) -> Payload:
    """``decode_payload`` for a frame a remote store returned as ``bytes``.

    The payload checksum is always verified. The payload is ``owned``: nothing
    but this read refers to ``data``, so the result can be a tensor over it.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    name, start, length, dtype, shape = _verify(raw, key, True, exact=True)
    payload = raw[start : start + length]
    tensor = _over_bytes(payload).view(dtype).view(shape)
    return Payload(name, payload, start, dtype, shape, tensor, owned=True)


class FrameRead(NamedTuple):
    """A whole frame read into memory of its own (a disk or node-tier file)."""

    frame: np.ndarray  # uint8, private to this read: the result may alias it
    # xxh3 of the payload the frame's prefix describes, taken while reading;
    # None if not taken (the payload is then hashed when decoded)
    payload_sum: int | None = None


def decode_read(read: FrameRead, key: ECKey) -> Payload:
    """``decode_payload`` for a ``FrameRead``, payload checksum included.

    The payload is ``owned``: its tensor is a view of the read's own array,
    so a disk hit reaches the caller without another copy.
    """
    raw = read.frame
    name, start, length, payload_sum, dtype, shape = _verify_header(raw, key)
    _check_length(raw, start + length, exact=True)
    data = raw[start : start + length]
    taken = read.payload_sum
    if (xxhash.xxh3_64_intdigest(data) if taken is None else taken) != payload_sum:
        raise CorruptEntryError("payload checksum mismatch")
    # Rows in numpy (no torch dispatch), then one torch view to the dtype.
    tensor = torch.from_numpy(data.reshape(shape[0], -1)).view(dtype)
    return Payload(name, data, start, dtype, shape, tensor, owned=True)


_warned_read_only = False


def _over_bytes(data: np.ndarray) -> torch.Tensor:
    # torch warns, once per process, that a tensor over read-only memory is
    # writable anyway. Here that is intended: the tensor becomes the only
    # owner of the bytes, and nothing else can see a write through it.
    global _warned_read_only
    if _warned_read_only:
        return torch.frombuffer(data, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.frombuffer(data, dtype=torch.uint8)
    _warned_read_only = True
    return tensor


def decode_frame(buffer: torch.Tensor, key: ECKey, *, verify_payload: bool = True) -> torch.Tensor:
    """A view of the tensor inside a frame read for ``key`` (aliases ``buffer``)."""
    return decode_payload(buffer, key, verify_payload=verify_payload).view()


def copy_out(
    payload: Payload, device: torch.device, non_blocking: bool, pin_memory: bool = False
) -> torch.Tensor:
    """The payload as a tensor on ``device`` that aliases no tier's memory.

    A CPU-pool payload is copied with torch's own kernel (``clone``: the same
    code and intra-op threads as any copy of the caller's); an ``owned``
    payload is returned as is on the CPU (zero copies).
    """
    source = payload.tensor
    if device.type != "cpu":
        return source.to(device=device, non_blocking=non_blocking and not payload.owned, copy=True)
    if pin_memory:
        out = torch.empty(payload.shape, dtype=payload.dtype, device="cpu", pin_memory=True)
        return out.copy_(source)
    return source if payload.owned else source.clone()
