"""ECKey: deterministic, injective, safe storage names; LMCache compatibility."""

from __future__ import annotations

import re

import pytest
from lmcache.utils import CacheEngineKey

from lmcache_ec.key import ECKey, EncoderIdentity

SAFE_NAME = re.compile(r"^[A-Za-z0-9.-]{1,200}$")

HOSTILE_MM_HASHES = [
    "../../etc/x",
    "../../../../../../tmp/escape",
    "/absolute/path",
    "a/b/c",
    "nul\x00byte",
    "\x00",
    "x" * (1 << 20),  # 1 MB
    "画像🙂ハッシュ",
    "\ud800lone-surrogate",
    "..",
    ".",
    "con",
    "a\nb\rc\td",
    "%2e%2e%2f",
    "\\..\\..\\windows",
    " ",
    "ec1.default-37a8eec1.m-62c66a7a." + "0" * 64,
]


@pytest.fixture
def identity() -> EncoderIdentity:
    return EncoderIdentity(model="google/gemma-3-4b-it", revision="main", dtype="bfloat16")


def test_storage_name_is_deterministic(identity):
    again = EncoderIdentity(model="google/gemma-3-4b-it", revision="main", dtype="bfloat16")
    assert identity.key("abc").storage_name == again.key("abc").storage_name
    assert identity.key("abc") == again.key("abc")
    assert hash(identity.key("abc")) == hash(again.key("abc"))


BASE = {
    "model": "m",
    "revision": "r",
    "fingerprint": "f",
    "dtype": "float16",
    "namespace": "ns",
    "weights": "w1",
}


@pytest.mark.parametrize("field", list(BASE))
def test_every_identity_field_changes_the_key(field):
    base = BASE
    changed = dict(base, **{field: "float32" if field == "dtype" else base[field] + "x"})
    assert EncoderIdentity(**base).key("h") != EncoderIdentity(**changed).key("h")


# Two namespaces (and two models) whose slugs are equal: same storage prefix, so
# only the digest tells them apart.
COLLIDING = {
    "namespace": ("t" * 32 + "15057", "t" * 32 + "25505"),
    "model": ("t" * 32 + "15057", "t" * 32 + "25505"),
}


@pytest.mark.parametrize("field", list(BASE))
def test_every_identity_field_is_in_the_digest(field):
    # The storage name's prefix carries slugs of the namespace and model; a
    # field left out of the SHA-256 would still change the name through them.
    # Compare the digests alone, on inputs whose slugs are equal.
    base = BASE
    if field in COLLIDING:
        first, second = COLLIDING[field]
        a = EncoderIdentity(**dict(base, **{field: first}))
        b = EncoderIdentity(**dict(base, **{field: second}))
        assert a.storage_prefix == b.storage_prefix  # the slugs do collide
    else:
        a = EncoderIdentity(**base)
        b = EncoderIdentity(**dict(base, **{field: "float32" if field == "dtype" else "other"}))
    assert a.key("h").digest_hex != b.key("h").digest_hex


def test_mm_hash_is_in_the_digest(identity):
    assert identity.key("a").digest_hex != identity.key("b").digest_hex


def test_field_boundaries_do_not_collide():
    a = EncoderIdentity(model="ab", revision="c").key("h")
    b = EncoderIdentity(model="a", revision="bc").key("h")
    assert a != b


def test_hostile_mm_hashes_give_safe_distinct_names(identity):
    names = [identity.key(h).storage_name for h in HOSTILE_MM_HASHES]
    for name in names:
        assert SAFE_NAME.match(name), name
        assert ".." not in name and "/" not in name
    assert len(set(names)) == len(names)


def test_hostile_identity_fields_give_safe_names():
    identity = EncoderIdentity(model="../../" + "m" * 5000, namespace="\x00/../ns")
    name = identity.key("h").storage_name
    assert SAFE_NAME.match(name), name


def test_namespace_prefix_selects_one_namespace():
    a = EncoderIdentity(model="m", namespace="a/b")
    b = EncoderIdentity(model="m", namespace="a-b")
    assert a.storage_prefix != b.storage_prefix
    assert a.key("h").storage_name.startswith(a.storage_prefix)


def test_full_mm_hash_is_kept(identity):
    long_hash = "f" * 4096
    assert identity.key(long_hash).mm_hash == long_hash
    assert identity.key(long_hash) != identity.key(long_hash[:-1])


def test_key_is_a_cache_engine_key_and_rebuilds_from_its_name(identity):
    key = identity.key("abc")
    assert isinstance(key, CacheEngineKey)
    assert key.to_string() == key.storage_name
    rebuilt = ECKey.from_storage_name(key.storage_name)
    assert rebuilt == key and hash(rebuilt) == hash(key)
    assert {key: 1}[rebuilt] == 1
    assert rebuilt.mm_hash is None
    assert isinstance(key.chunk_hash, int)


@pytest.mark.parametrize("name", ["", "x", "../ec1.a.b." + "0" * 64, "ec1.a.b." + "g" * 64])
def test_from_storage_name_rejects_other_strings(name):
    with pytest.raises(ValueError):
        ECKey.from_storage_name(name)


def test_bad_mm_hash_types(identity):
    with pytest.raises(TypeError):
        identity.key(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        identity.key(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        identity.key("")


def test_bad_identity():
    with pytest.raises(ValueError):
        EncoderIdentity(model="")
    with pytest.raises(ValueError):
        EncoderIdentity(model="m", dtype="int8")
    with pytest.raises(TypeError):
        EncoderIdentity(model=None)  # type: ignore[arg-type]


def test_weights_version_changes_the_digest_and_unset_keeps_old_digests():
    unset = EncoderIdentity(model="m")
    assert EncoderIdentity(model="m", weights="w1").key("h") != unset.key("h")
    assert EncoderIdentity(model="m", weights="w1").key("h") != (
        EncoderIdentity(model="m", weights="w2").key("h")
    )
    # Pinned: the digest of an identity without weights, as written before the
    # field existed (entries already stored stay reachable).
    assert unset.key("h").digest_hex == (
        "1e300062b82491effe7f0c7be03a31083923b4120c1972a532335c7044fa90c1"
    )
