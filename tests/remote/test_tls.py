"""rediss://: the remote tier over TLS, against a real redis-server with a TLS port."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lmcache_ec.remote.catalog import open_catalog
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import frames_sent_in_place, remote_config
from tests.servers import HOST, _wait_for_port, free_port


def _write_pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _certificates(directory: Path) -> dict[str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {
        "not_valid_before": now - datetime.timedelta(minutes=5),
        "not_valid_after": now + datetime.timedelta(hours=1),
    }
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lmcache-ec test CA")])
    ca = (
        x509.CertificateBuilder(
            subject_name=ca_name,
            issuer_name=ca_name,
            public_key=ca_key.public_key(),
            serial_number=x509.random_serial_number(),
            **valid,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder(
            subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]),
            issuer_name=ca_name,
            public_key=key.public_key(),
            serial_number=x509.random_serial_number(),
            **valid,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        "ca": _write_pem(directory / "ca.crt", ca.public_bytes(pem)),
        "cert": _write_pem(directory / "server.crt", server.public_bytes(pem)),
        "key": _write_pem(
            directory / "server.key",
            key.private_bytes(
                pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            ),
        ),
    }


@pytest.fixture
def tls_redis(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (Debian package redis-server)")
    files = _certificates(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            HOST,
            "--tls-cert-file",
            files["cert"],
            "--tls-key-file",
            files["key"],
            "--tls-ca-cert-file",
            files["ca"],
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "s3cret",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port)
        yield f"rediss://:s3cret@{HOST}:{port}/0?ssl_ca_certs={files['ca']}", port
    finally:
        process.kill()
        process.wait(10)


def test_entries_travel_over_tls(tls_redis, tmp_path, make_cache):
    url, _ = tls_redis
    tensors = {f"img-{i}": make_tensor((16, 64), torch.bfloat16, seed=i) for i in range(4)}
    with (
        make_cache(remote_config(url), model="tls/model") as writer,
        frames_sent_in_place() as sent,
    ):
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
    assert len(sent) == len(tensors)  # sent from the pool buffers
    reader = make_cache(remote_config(url), model="tls/model")
    for name, tensor in tensors.items():
        assert reader.contains(name) == "remote"
        assert bit_equal(reader.get(name), tensor)
    catalog = open_catalog(reader.config)
    assert catalog is not None
    with catalog:
        assert catalog.exists(reader.key("img-0").storage_name)


def test_plain_connection_to_a_tls_port_is_a_clean_miss(tls_redis, make_cache):
    _, port = tls_redis
    plain = f"redis://:s3cret@{HOST}:{port}"
    cache = make_cache(remote_config(plain), model="tls/model")
    assert cache.put("x", torch.ones(2, 2))  # the CPU tier still takes it
    assert cache.get("never-stored") is None
    assert cache.stats.snapshot()["tiers"]["remote"]["available"] is False
