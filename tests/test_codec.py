"""Frame encoding and every way a frame is rejected."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import xxhash

from lmcache_ec import codec
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.disk_layout import READ_CHUNK, read_frame, read_header_file
from tests.conftest import bit_equal, make_tensor

IDENTITY = EncoderIdentity(model="m")


def frame_of(tensor: torch.Tensor, mm_hash: str = "h") -> torch.Tensor:
    key = IDENTITY.key(mm_hash)
    header = codec.encode_header(key, tensor)
    buffer = torch.empty(codec.frame_size(header, tensor), dtype=torch.uint8)
    codec.write_frame(buffer, header, tensor)
    return buffer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_trip(dtype):
    tensor = make_tensor((7, 33), dtype)
    frame = frame_of(tensor)
    assert frame.numel() % 2 == 0
    out = codec.decode_frame(frame, IDENTITY.key("h"))
    assert bit_equal(out, tensor)
    header = codec.read_header(frame)
    assert header["mm_hash"] == "h" and header["model"] == "m"
    assert header["shape"] == [7, 33]


def test_non_contiguous_input():
    tensor = make_tensor((16, 8), torch.float32).t()
    out = codec.decode_frame(frame_of(tensor), IDENTITY.key("h"))
    assert bit_equal(out, tensor.contiguous())


def test_a_contiguous_tensor_whose_unit_last_dim_has_another_stride_round_trips():
    # row.t(): contiguous by torch's rule (a size-1 dim's stride is free), but
    # its last stride is not 1, so it cannot be viewed as bytes.
    tensor = make_tensor((1, 37), torch.float32).t()
    assert tensor.is_contiguous() and tensor.stride(-1) != 1
    out = codec.decode_frame(frame_of(tensor), IDENTITY.key("h"))
    assert bit_equal(out, tensor.contiguous())


def test_a_long_header_is_verified_but_not_kept_in_the_parse_cache(tmp_path):
    tensor = make_tensor((4, 8), torch.float16)
    short, long = "short-hash", "h" * 100_000  # a hostile mm_hash: a 100 KB header
    for mm_hash in (short, long):
        read = _read(tmp_path, frame_of(tensor, mm_hash).numpy().tobytes())
        assert bit_equal(codec.decode_read(read, IDENTITY.key(mm_hash)).view(), tensor)
    kept = [len(header) for header in codec._PARSED]
    assert kept and max(kept) < 4096  # the short one is kept, the long one is not


@pytest.mark.parametrize(
    ("offset", "reason"),
    [(0, "bad magic"), (70, "header checksum"), (-1, "payload checksum")],
)
def test_flipped_byte_is_detected(offset, reason):
    frame = frame_of(make_tensor((4, 4), torch.float32))
    frame[offset] ^= 0xFF
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_frame(frame, IDENTITY.key("h"))


def test_truncated_frame_is_detected():
    frame = frame_of(make_tensor((4, 4), torch.float32))
    with pytest.raises(codec.CorruptEntryError, match="truncated"):
        codec.decode_frame(frame[:-8].clone(), IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match="truncated"):
        codec.decode_frame(frame[:10].clone(), IDENTITY.key("h"))


def test_frame_of_another_key_is_rejected():
    frame = frame_of(make_tensor((4, 4), torch.float32), mm_hash="a")
    with pytest.raises(codec.CorruptEntryError, match="another key"):
        codec.decode_frame(frame, IDENTITY.key("b"))


def test_skipping_payload_check_still_checks_header():
    frame = frame_of(make_tensor((4, 4), torch.float32))
    frame[-1] ^= 0xFF
    codec.decode_frame(frame, IDENTITY.key("h"), verify_payload=False)
    frame[70] ^= 0xFF
    with pytest.raises(codec.CorruptEntryError):
        codec.decode_frame(frame, IDENTITY.key("h"), verify_payload=False)


# -- the path disk reads take: read_frame (hashing while reading) + decode_read


def _read(tmp_path, data: bytes, size: int | None = None) -> codec.FrameRead:
    """``data`` written to a file and read back as the disk tier reads it;
    ``size``: the file's size as taken before it shrank to ``data``."""
    path = tmp_path / "frame.pt"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_frame(fd, len(data) if size is None else size)
    finally:
        os.close(fd)


# one read piece; several (a 7 MB payload: 2 MB pieces)
@pytest.mark.parametrize("shape", [(4, 4), (300, 1024), (1800, 2048)])
def test_disk_read_path_round_trip(tmp_path, shape):
    tensor = make_tensor(shape, torch.float16)
    read = _read(tmp_path, frame_of(tensor).numpy().tobytes())
    assert read.payload_sum is not None  # hashed while read
    payload = codec.decode_read(read, IDENTITY.key("h"))
    assert bit_equal(payload.view(), tensor)
    assert payload.owned and payload.data.base is not None  # a view of the read: no copy


@pytest.mark.parametrize("shape", [(300, 1024), (1800, 2048)])
@pytest.mark.parametrize("where", ["payload-start", "payload-end", "piece-boundary"])
def test_disk_read_path_checks_the_payload(tmp_path, shape, where):
    data = bytearray(frame_of(make_tensor(shape, torch.float16)).numpy().tobytes())
    header_len = codec.read_prefix(bytes(data[: codec.PREFIX_SIZE]))[0]
    at = {
        "payload-start": codec.PREFIX_SIZE + header_len,
        "payload-end": len(data) - 1,
        "piece-boundary": min(READ_CHUNK, len(data) - 1),
    }[where]
    data[at] ^= 0x01
    read = _read(tmp_path, bytes(data))
    with pytest.raises(codec.CorruptEntryError, match="payload checksum"):
        codec.decode_read(read, IDENTITY.key("h"))
    # Not hashed while read (the node tier's mappings): checked when decoded.
    with pytest.raises(codec.CorruptEntryError, match="payload checksum"):
        codec.decode_read(codec.FrameRead(read.frame), IDENTITY.key("h"))


def test_disk_read_path_checks_the_header_and_the_key(tmp_path):
    data = bytearray(frame_of(make_tensor((4, 4), torch.float32)).numpy().tobytes())
    with pytest.raises(codec.CorruptEntryError, match="another key"):
        codec.decode_read(_read(tmp_path, bytes(data)), IDENTITY.key("other"))
    data[70] ^= 0x01
    with pytest.raises(codec.CorruptEntryError, match="header checksum"):
        codec.decode_read(_read(tmp_path, bytes(data)), IDENTITY.key("h"))


def test_disk_read_path_rejects_short_files(tmp_path):
    data = frame_of(make_tensor((1800, 2048), torch.float16)).numpy().tobytes()
    for cut in (len(data) - 8, READ_CHUNK + 5, len(data) // 2, codec.PREFIX_SIZE + 10, 10, 0):
        with pytest.raises(codec.CorruptEntryError):  # when read, or when decoded
            codec.decode_read(_read(tmp_path, data[:cut]), IDENTITY.key("h"))
    # A file that shrank after its size was taken: fewer bytes than the array.
    for cut in (len(data) - 100, READ_CHUNK - 100):
        read = _read(tmp_path, data[:cut], size=len(data))
        assert read.frame.size == cut
        with pytest.raises(codec.CorruptEntryError, match="truncated"):
            codec.decode_read(read, IDENTITY.key("h"))


def test_remote_read_path_checks_the_payload():
    # Remote stores hand back bytes: decode_bytes, payload checksum always on.
    tensor = make_tensor((300, 1024), torch.float16)
    data = bytearray(frame_of(tensor).numpy().tobytes())
    assert bit_equal(codec.decode_bytes(bytes(data), IDENTITY.key("h")).view(), tensor)
    data[-1] ^= 0x01
    with pytest.raises(codec.CorruptEntryError, match="payload checksum"):
        codec.decode_bytes(bytes(data), IDENTITY.key("h"))


def _with_header(frame: torch.Tensor, header: bytes) -> torch.Tensor:
    """``frame`` with its header replaced by ``header`` (padded), checksums right."""
    raw = frame.numpy().tobytes()
    header_len, payload_len, payload_sum, _ = codec.read_prefix(raw)
    start = codec.PREFIX_SIZE + header_len
    payload = raw[start : start + payload_len]
    header += b" " * (-len(header) % codec.ALIGN)
    prefix = codec.PREFIX.pack(
        codec.MAGIC, len(header), 0, payload_len, payload_sum, xxhash.xxh3_64_intdigest(header)
    )
    prefix += b"\0" * (codec.PREFIX_SIZE - len(prefix))
    return torch.frombuffer(bytearray(prefix + header + payload), dtype=torch.uint8)


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        ("not-utf8", "unreadable header"),
        ("utf16-json", "unreadable header"),  # valid JSON, but not what put writes
        ("json-list", "unreadable header"),
        ("zero-dim", "bad shape"),
        ("three-dims", "bad shape"),
        ("bool-dim", "bad shape"),
        ("float-dim", "bad shape"),
        ("no-name", "another key"),
        ("unknown-dtype", "unreadable header"),
        ("created-text", "bad created"),  # listings and purges by age take it as a number
        ("created-nan", "bad created"),
        ("created-null", "bad created"),
    ],
)
def test_header_with_a_valid_checksum_but_hostile_content_is_rejected(tmp_path, hostile, reason):
    """A header's checksum only says it was not damaged; what it holds is checked too,
    on both read paths (frames in memory, frames read from a file)."""
    tensor = make_tensor((4, 4), torch.float32)
    frame = frame_of(tensor)
    text = codec.read_header(frame)
    text = {
        k: v
        for k, v in text.items()
        if k not in ("torch_dtype", "payload_sum", "payload_len", "frame_len")
    }
    header = {
        "not-utf8": b"\xff\xfe\x00{",
        "utf16-json": json.dumps(text).encode("utf-16"),
        "json-list": b"[1, 2]",
        "zero-dim": json.dumps({**text, "shape": [0, 4]}).encode(),
        "three-dims": json.dumps({**text, "shape": [4, 2, 2]}).encode(),
        "bool-dim": json.dumps({**text, "shape": [True, 16]}).encode(),
        "float-dim": json.dumps({**text, "shape": [4.0, 4]}).encode(),
        "no-name": json.dumps({k: v for k, v in text.items() if k != "name"}).encode(),
        "unknown-dtype": json.dumps({**text, "tensor_dtype": "int8"}).encode(),
        "created-text": json.dumps({**text, "created": "yesterday"}).encode(),
        "created-nan": json.dumps({**text, "created": float("nan")}).encode(),
        "created-null": json.dumps({**text, "created": None}).encode(),
    }[hostile]
    bad = _with_header(frame, header)
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_frame(bad, IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_read(_read(tmp_path, bad.numpy().tobytes()), IDENTITY.key("h"))
    # The same rebuild with the header put wrote reads back as the tensor.
    good = _with_header(frame, json.dumps(text, separators=(",", ":")).encode())
    assert bit_equal(codec.decode_frame(good, IDENTITY.key("h")), tensor)


def test_dtype_other_than_the_pinned_one_is_rejected_on_every_read_path(tmp_path):
    """A key pinned to bfloat16 never reads a float32 frame stored under its name."""
    pinned = EncoderIdentity(model="m", dtype="bfloat16").key("h")
    tensor = make_tensor((4, 4), torch.float32)
    header = codec.encode_header(pinned, tensor)  # its name, another dtype
    buffer = torch.empty(codec.frame_size(header, tensor), dtype=torch.uint8)
    codec.write_frame(buffer, header, tensor)
    data = buffer.numpy().tobytes()
    reason = "differs from the encoder dtype"
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_frame(buffer, pinned)
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_read(_read(tmp_path, data), pinned)
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_bytes(data, pinned)
    # Unpinned, the same frame reads back as stored.
    assert bit_equal(codec.decode_frame(frame_of(tensor), IDENTITY.key("h")), tensor)


@pytest.mark.parametrize("shape", [[2, 4], [8, 4]])
def test_shape_must_cover_the_payload_exactly(tmp_path, shape):
    """A header whose shape is smaller (or larger) than its payload is rejected on
    both read paths, never read as a tensor of another shape."""
    frame = frame_of(make_tensor((4, 4), torch.float32))
    text = {
        k: v
        for k, v in codec.read_header(frame).items()
        if k not in ("torch_dtype", "payload_sum", "payload_len", "frame_len")
    }
    bad = _with_header(frame, json.dumps({**text, "shape": shape}).encode())
    with pytest.raises(codec.CorruptEntryError, match="shape does not match"):
        codec.decode_frame(bad, IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match="shape does not match"):
        codec.decode_read(_read(tmp_path, bad.numpy().tobytes()), IDENTITY.key("h"))


def test_stored_size_must_equal_the_declared_size(tmp_path):
    """The one size rule of every tier (``check_stored_size``): a frame read from a
    file or a store is exactly prefix + header + payload."""
    data = frame_of(make_tensor((4, 4), torch.float32)).numpy().tobytes()
    assert codec.declared_size(data[: codec.PREFIX_SIZE]) == len(data)
    assert codec.check_stored_size(data[: codec.PREFIX_SIZE], len(data)) == len(data)
    for stored in (len(data) - 1, len(data) + 1, len(data) + (256 << 20)):
        with pytest.raises(codec.CorruptEntryError, match="stored size"):
            codec.check_stored_size(data[: codec.PREFIX_SIZE], stored)
    with pytest.raises(codec.CorruptEntryError, match="stored size"):
        codec.decode_bytes(data + b"\0", IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match="stored size"):
        codec.decode_read(codec.FrameRead(np.frombuffer(data + b"\0", np.uint8)), IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match="stored size"):
        _read(tmp_path, data + b"\0")  # the disk tier finds it before reading the payload
    # A pool buffer may be longer than its frame (allocator padding).
    padded = torch.zeros(len(data) + 64, dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    codec.decode_frame(padded, IDENTITY.key("h"))
    # A header length beyond the file is found before a read is sized by it.
    huge = bytearray(data)
    huge[8:12] = (1 << 31).to_bytes(4, "little")
    (tmp_path / "huge.pt").write_bytes(bytes(huge))
    with pytest.raises(codec.CorruptEntryError, match="truncated header"):
        read_header_file(str(tmp_path / "huge.pt"))
