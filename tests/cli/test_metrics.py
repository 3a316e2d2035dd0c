"""Prometheus export: counters and histograms match a known workload."""

from __future__ import annotations

from urllib.request import urlopen

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from lmcache_ec import ECCache
from lmcache_ec.metrics_export import register, start_http_server


def _workload(cache: ECCache) -> int:
    """4 puts, 4 CPU hits, 2 misses, then (CPU dropped) 2 disk hits; frame bytes."""
    tensors = {f"img-{i}": torch.full((4, 8), float(i), dtype=torch.float32) for i in range(4)}
    for mm_hash, tensor in tensors.items():
        assert cache.put(mm_hash, tensor)
    cache.flush()
    for mm_hash in tensors:
        assert cache.get(mm_hash) is not None
    assert cache.get("absent-1") is None and cache.get("absent-2") is None
    for mm_hash in ("img-0", "img-1"):
        cache._cpu.remove(cache.key(mm_hash), force=True)
        assert cache.get(mm_hash) is not None
    return cache.stats.bytes_in


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if k not in ("model", "namespace"))
            )
            out[(sample.name, labels)] = sample.value
    return out


def _check(samples: dict, bytes_in: int) -> None:
    assert samples[("lmcache_ec_hits_total", (("tier", "cpu"),))] == 4
    assert samples[("lmcache_ec_hits_total", (("tier", "disk"),))] == 2
    assert samples[("lmcache_ec_misses_total", ())] == 2
    assert samples[("lmcache_ec_puts_total", ())] == 4
    assert samples[("lmcache_ec_bytes_in_total", ())] == bytes_in
    assert samples[("lmcache_ec_bytes_out_total", ())] == 6 * 4 * 8 * 4
    assert samples[("lmcache_ec_integrity_failures_total", ())] == 0
    assert samples[("lmcache_ec_get_latency_seconds_count", ())] == 8
    assert samples[("lmcache_ec_get_latency_seconds_bucket", (("le", "+Inf"),))] == 8
    assert samples[("lmcache_ec_put_latency_seconds_count", ())] == 4
    assert samples[("lmcache_ec_get_latency_seconds_sum", ())] > 0


def test_registry_counters_match_workload(cache):
    registry = CollectorRegistry()
    register(cache, registry)
    bytes_in = _workload(cache)
    from prometheus_client import generate_latest

    _check(_samples(generate_latest(registry).decode()), bytes_in)


def test_integrity_failure_is_counted(cache, disk_dir):
    registry = CollectorRegistry()
    register(cache, registry)
    cache.put("x", torch.ones(4, 8))
    cache.flush()
    cache._cpu.remove(cache.key("x"), force=True)
    (path,) = disk_dir.glob("*.pt")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert cache.get("x") is None
    assert (
        registry.get_sample_value(
            "lmcache_ec_integrity_failures_total",
            {"model": "test/model", "namespace": "default"},
        )
        == 1
    )


def test_http_endpoint_and_stats_command(config_file, invoke_json, make_cache):
    with make_cache(config_file, model="test/model") as cache:
        server, _thread = start_http_server(cache, port=0)
        try:
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            bytes_in = _workload(cache)
            with urlopen(url, timeout=5) as response:
                _check(_samples(response.read().decode()), bytes_in)
            data = invoke_json("stats", "--config", config_file, "--metrics-url", url)
        finally:
            server.shutdown()
    counters = data["counters"]
    assert counters["hits[cpu]"] == 4 and counters["hits[disk]"] == 2
    assert counters["misses"] == 2 and counters["puts"] == 4
    assert counters["hit_rate"] == pytest.approx(6 / 8)
    assert data["tiers"]["disk"]["entries"] == 4


def test_stats_reports_unreachable_metrics_url(config_file, invoke):
    from tests.servers import free_port

    result = invoke(
        "stats",
        "--config",
        config_file,
        "--metrics-url",
        f"http://127.0.0.1:{free_port()}/metrics",
        expect=1,
    )
    assert "cannot read metrics" in result.output
