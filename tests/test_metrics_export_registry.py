"""``metrics_export.register`` as docs/operations.md offers it: once per cache, on a
registry already served, makes a page Prometheus takes.

- caches of several models registered one by one on one registry (one that
  checks names, as the global ``REGISTRY`` does, or one that does not): no
  ``Duplicated timeseries``, and every family written once;
- caches of one ``(model, namespace)`` (two dtypes, two weights versions): one
  series per label set, their counters and histograms summed, a tier
  ``available`` only while it works in every one of them; the page parses as
  OpenMetrics (what Prometheus negotiates), which refuses a repeated series;
- a cache registered twice is counted once.
"""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from lmcache_ec.metrics_export import register
from tests.servers import free_port


def _series(registry: CollectorRegistry) -> list[tuple[str, tuple]]:
    """Every sample of a scrape as (name, labels), repeats kept."""
    text = generate_latest(registry).decode()
    return [
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"model": "m", "namespace": "default", **labels})


@pytest.mark.parametrize("auto_describe", [True, False], ids=["checks-names", "plain"])
def test_caches_of_several_models_register_one_by_one_on_one_registry(make_cache, auto_describe):
    registry = CollectorRegistry(auto_describe=auto_describe)
    first = register(make_cache(model="vision-a"), registry)
    second = register(make_cache(model="vision-b"), registry)
    text = generate_latest(registry).decode()
    assert text.count("# TYPE lmcache_ec_misses_total counter") == 1, text
    assert second is first  # the registry's one collector, to remove a cache from
    series = _series(registry)
    assert len(series) == len(set(series))
    models = {dict(labels)["model"] for name, labels in series if name == "lmcache_ec_misses_total"}
    assert models == {"vision-a", "vision-b"}


def test_caches_of_one_model_and_namespace_make_one_series_summed(make_cache):
    one = make_cache(model="m", dtype="float32")
    other = make_cache(model="m", dtype="bfloat16")
    registry = CollectorRegistry()
    register(one, registry)
    register(other, registry)
    assert one.put("x", torch.ones(4, 4))
    assert one.get("x") is not None
    assert one.get("absent") is None and other.get("absent") is None
    series = _series(registry)
    assert len(series) == len(set(series)), sorted(series)
    list(parse_openmetrics(openmetrics_latest(registry).decode()))  # refuses a repeated series
    assert _value(registry, "lmcache_ec_misses_total") == 2
    assert _value(registry, "lmcache_ec_hits_total", tier="cpu") == 1
    assert _value(registry, "lmcache_ec_puts_total") == 1
    assert _value(registry, "lmcache_ec_get_latency_seconds_count") == 3
    assert _value(registry, "lmcache_ec_get_latency_seconds_bucket", le="+Inf") == 3


def test_a_tier_failing_in_one_cache_of_a_label_set_is_unavailable(make_cache, redis_url):
    working = make_cache(model="m", dtype="float32", remote_url=redis_url, remote_timeout=1.0)
    failing = make_cache(
        model="m",
        dtype="bfloat16",
        remote_url=f"redis://127.0.0.1:{free_port()}",  # nothing listens
        remote_timeout=1.0,
    )
    registry = CollectorRegistry()
    register([failing, working], registry)  # the working one last: it must not win
    assert failing.get("absent") is None  # the remote call fails: the tier is down
    assert working.stats.snapshot()["tiers"]["remote"]["available"]
    assert not failing.stats.snapshot()["tiers"]["remote"]["available"]
    assert _value(registry, "lmcache_ec_tier_available", tier="remote") == 0


def test_a_cache_registered_twice_is_counted_once(cache):
    registry = CollectorRegistry()
    register(cache, registry)
    register(cache, registry)
    assert cache.get("absent") is None
    assert (
        registry.get_sample_value(
            "lmcache_ec_misses_total", {"model": "test/model", "namespace": "default"}
        )
        == 1
    )
