"""ECKey: the identity of one encoder output and the storage name every tier uses.

An entry is identified by the full ``mm_hash`` plus the encoder identity
(namespace, model, revision, encoder-config fingerprint, encoder dtype, encoder
weights version) and the key-format version. All of it goes into a SHA-256
digest; the storage name is ``ec<version>.<namespace-slug>.<model-slug>.<digest-hex>``:

- only ``[A-Za-z0-9.-]`` and at most ~160 bytes, whatever the inputs, so it is
  a safe file name, Redis key and S3 object name (``../../x``, NUL bytes,
  1 MB strings and lone surrogates all end up inside the digest);
- two identities that differ in any field get different digests, so entries
  of two models, two revisions or two tenants never meet;
- the slugs carry a short hash of the exact string, so a storage-name prefix
  selects one namespace (and model) up to a 32-bit tag collision; listing
  and purging confirm the exact strings from each entry's header.

``ECKey`` subclasses LMCache's ``CacheEngineKey`` so that ``StorageManager`` and
its backends take it unchanged. Backends only hash, compare and ``to_string()``
keys; equality is on the storage name alone, which is why a key rebuilt from a
file name (``ECKey.from_storage_name``) finds the entry written under the full key.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from lmcache.utils import CacheEngineKey

KEY_FORMAT_VERSION = 1

# Encoder output dtypes the tier stores (the checksum and framing are dtype-blind,
# but these are the ones vLLM encoders produce).
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SUPPORTED_DTYPES.items()}

_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")
_SLUG_MAX = 32
_STORAGE_NAME = re.compile(
    r"^ec(?P<version>[0-9]+)\.(?P<ns>[A-Za-z0-9-]+)\.(?P<model>[A-Za-z0-9-]+)"
    r"\.(?P<digest>[0-9a-f]{64})\Z"  # \Z: "$" also matches before a final newline
)


def _utf8(text: str) -> bytes:
    # surrogatepass: any Python str (lone surrogates included) has one encoding.
    return text.encode("utf-8", "surrogatepass")


def slug(text: str) -> str:
    """A short, safe, practically injective label for ``text``."""
    readable = _SLUG_UNSAFE.sub("-", text).strip("-")[:_SLUG_MAX].strip("-")
    tag = hashlib.sha256(_utf8(text)).hexdigest()[:8]
    return f"{readable}-{tag}" if readable else tag


def dtype_name(dtype: torch.dtype) -> str:
    """Name of a supported dtype; ``ValueError`` otherwise."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        supported = ", ".join(SUPPORTED_DTYPES)
        raise ValueError(f"unsupported encoder dtype {dtype}; supported: {supported}") from None


@dataclass(frozen=True)
class EncoderIdentity:
    """Who produced a tensor: everything besides ``mm_hash`` that keys an entry.

    ``dtype`` is the encoder output dtype name (``bfloat16`` …) or ``""`` when
    the caller does not pin it (then entries of any supported dtype are kept
    under this identity and come back in the dtype they were stored in).
    """

    model: str
    revision: str = ""
    fingerprint: str = ""
    dtype: str = ""
    namespace: str = "default"
    weights: str = ""
    _prefix_hasher: Any = field(init=False, repr=False, compare=False)
    storage_prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("model", "revision", "fingerprint", "dtype", "namespace", "weights"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        if not self.model:
            raise ValueError("model must be a non-empty string")
        if not self.namespace:
            raise ValueError("namespace must be a non-empty string")
        if self.dtype and self.dtype not in SUPPORTED_DTYPES:
            supported = ", ".join(SUPPORTED_DTYPES)
            raise ValueError(f"dtype must be one of {supported} or empty")
        hasher = hashlib.sha256()
        for part in (
            str(KEY_FORMAT_VERSION),
            self.namespace,
            self.model,
            self.revision,
            self.fingerprint,
            self.dtype,
        ):
            _feed(hasher, part)
        if self.weights:
            # Fed only when set, so identities without a weights version keep
            # the digests they had before the field existed; the length
            # prefixes keep the two forms from ever colliding.
            _feed(hasher, self.weights)
        object.__setattr__(self, "_prefix_hasher", hasher)
        object.__setattr__(
            self,
            "storage_prefix",
            f"ec{KEY_FORMAT_VERSION}.{slug(self.namespace)}.{slug(self.model)}.",
        )

    def key(self, mm_hash: str) -> ECKey:
        """The key of ``mm_hash`` under this identity."""
        return ECKey(self.storage_name(mm_hash), identity=self, mm_hash=mm_hash)

    def storage_name(self, mm_hash: str) -> str:
        """``key(mm_hash).storage_name`` without building the key (a hot path's need)."""
        if not isinstance(mm_hash, str):
            raise TypeError(f"mm_hash must be a str, not {type(mm_hash).__name__}")
        if not mm_hash:
            raise ValueError("mm_hash must be a non-empty string")
        hasher = self._prefix_hasher.copy()
        _feed(hasher, mm_hash)
        return self.storage_prefix + hasher.hexdigest()

    def as_dict(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "model": self.model,
            "revision": self.revision,
            "fingerprint": self.fingerprint,
            "dtype": self.dtype,
            "weights": self.weights,
        }


def _feed(hasher: Any, part: str) -> None:
    # Length-prefixed so that ("ab", "c") and ("a", "bc") never collide.
    data = _utf8(part)
    hasher.update(len(data).to_bytes(8, "big"))
    hasher.update(data)


class ECKey(CacheEngineKey):
    """A ``CacheEngineKey`` for one encoder output.

    ``identity`` and ``mm_hash`` are set on keys built from an identity and are
    ``None`` on keys rebuilt from a storage name (enough to find, read and
    delete an entry; the entry's header carries the full identity).
    """

    __slots__ = ("identity", "mm_hash", "storage_name")

    def __init__(
        self,
        storage_name: str,
        *,
        identity: EncoderIdentity | None = None,
        mm_hash: str | None = None,
    ) -> None:
        digest_hex = storage_name[-64:]
        super().__init__(
            model_name=storage_name[: -64 - 1],
            world_size=1,
            worker_id=0,
            # LMCache's stats and controller messages want an int chunk hash.
            chunk_hash=int(digest_hex[:16], 16),
            dtype=torch.uint8,  # entries are framed bytes, see codec.py
            request_configs=None,
        )
        self.storage_name = storage_name
        self.identity = identity
        self.mm_hash = mm_hash

    @classmethod
    def from_storage_name(cls, name: str) -> ECKey:
        """Rebuild a key from a storage name; ``ValueError`` if it is not one."""
        if not isinstance(name, str) or not _STORAGE_NAME.match(name):
            raise ValueError(f"not an lmcache-ec storage name: {name!r:.200}")
        return cls(name)

    @staticmethod
    def is_storage_name(name: str) -> bool:
        return bool(_STORAGE_NAME.match(name))

    @property
    def digest_hex(self) -> str:
        return self.storage_name[-64:]

    def to_string(self) -> str:
        return self.storage_name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ECKey) and other.storage_name == self.storage_name

    def __hash__(self) -> int:
        return hash(self.storage_name)

    def __repr__(self) -> str:
        shown = "?" if self.mm_hash is None else self.mm_hash[:24]
        if self.mm_hash is not None and len(self.mm_hash) > 24:
            shown += "…"
        return f"ECKey({self.storage_name}, mm_hash={shown!r})"

    __str__ = __repr__
