"""Frame encoding and every way a frame is rejected."""

from __future__ import annotations

import json
import os

import pytest
import torch
import xxhash

from lmcache_ec import codec
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.disk_layout import READ_CHUNK, read_frame
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
        read = _read(tmp_path, data[:cut])
        with pytest.raises(codec.CorruptEntryError):
            codec.decode_read(read, IDENTITY.key("h"))
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
    }[hostile]
    bad = _with_header(frame, header)
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_frame(bad, IDENTITY.key("h"))
    with pytest.raises(codec.CorruptEntryError, match=reason):
        codec.decode_read(_read(tmp_path, bad.numpy().tobytes()), IDENTITY.key("h"))
    # The same rebuild with the header put wrote reads back as the tensor.
    good = _with_header(frame, json.dumps(text, separators=(",", ":")).encode())
    assert bit_equal(codec.decode_frame(good, IDENTITY.key("h")), tensor)
