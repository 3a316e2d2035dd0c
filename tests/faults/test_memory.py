"""Memory stays bounded by the configured CPU tier under 10x its capacity.

A separate process runs the workload so that its resident set is its own: a
16 MB CPU tier over a 64 MB disk tier and Redis receives 160 distinct 1 MB
entries (10x the CPU tier) while reading earlier ones back from every tier,
one by one and in batches. After a warm-up that touches every code path, the
peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) may grow
by at most the CPU tier plus ``MARGIN``, and the second half of the workload
may not grow it further than the first half did (no per-entry leak).
"""

from __future__ import annotations

import json
import textwrap

from tests.faults.processes import worker

CPU_MB = 16
ENTRY_MB = 1
MARGIN_MB = 48  # transient tensors of the workload, allocator slack, Python objects

WORKLOAD = textwrap.dedent(
    f"""
    import json, random, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import make_tensor
    from tests.faults.checks import exact_or_miss

    def status():
        out = {{}}
        with open("/proc/self/status") as stream:
            for line in stream:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out[name] = int(value.split()[0]) * 1024
        return out

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as stream:
            stream.write("5")

    disk, url = sys.argv[1], sys.argv[2]
    config = {{"local_cpu": True, "max_local_cpu_size": {CPU_MB} / 1024,
               "local_disk": disk, "max_local_disk_size": 64 / 1024,
               "remote_url": url, "remote_timeout": 5}}
    shape = ({ENTRY_MB} * 512, 1024)  # bfloat16
    entries = {CPU_MB} * 10 // {ENTRY_MB}
    rng = random.Random(0)
    tensor = lambda i: make_tensor(shape, torch.bfloat16, seed=i)

    with ECCache.from_config(config, model="rss") as cache:
        # Warm-up: every path once (CPU, disk and remote hits, batches), then drop it.
        for i in range(4):
            cache.put(f"warm-{{i}}", tensor(1000 + i))
        cache.flush(30)
        cache.get_many([f"warm-{{i}}" for i in range(4)])
        with ECCache.from_config(dict(config, local_disk=None), model="rss") as other:
            other.get("warm-0")
        reset_peak()
        baseline = status()["VmRSS"]
        half = None
        for i in range(entries):
            assert cache.put(f"img-{{i}}", tensor(i)) in (True, False)
            cache.flush(30)
            j = rng.randrange(i + 1)
            exact_or_miss(cache.get(f"img-{{j}}"), tensor(j))
            if i % 10 == 9:
                batch = [rng.randrange(i + 1) for _ in range(8)]
                answers = cache.get_many([f"img-{{j}}" for j in batch])
                for j, answer in zip(batch, answers):
                    exact_or_miss(answer, tensor(j))
            if i == entries // 2 - 1:
                half = status()["VmHWM"]
        end = status()
        stats = cache.stats.snapshot()
    print(json.dumps({{"baseline": baseline, "half_peak": half, "peak": end["VmHWM"],
                       "rss": end["VmRSS"], "capacity": {CPU_MB} << 20, "stats": {{
                           "hits": stats["hits"], "misses": stats["misses"],
                           "puts": stats["puts"], "put_rejected": stats["put_rejected"],
                           "integrity_failures": stats["integrity_failures"],
                           "tier_errors": stats["tier_errors"]}}}}))
    """
)


def test_rss_bounded_by_the_cpu_tier_under_10x_its_capacity(disk_dir, redis_url, fault_table):
    proc = worker(WORKLOAD, str(disk_dir), redis_url)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    mb = 1 << 20
    growth = result["peak"] - result["baseline"]
    first_half = result["half_peak"] - result["baseline"]
    stats = result["stats"]
    assert growth <= result["capacity"] + MARGIN_MB * mb, result
    assert growth - first_half <= MARGIN_MB // 2 * mb, result  # no per-entry growth
    # The workload did what it says: 10x the CPU tier written, hits from every tier.
    assert stats["puts"] >= 10 * CPU_MB // ENTRY_MB
    assert stats["hits"].get("disk", 0) > 0 and stats["hits"].get("remote", 0) > 0
    assert stats["integrity_failures"] == 0 and stats["tier_errors"] == {}
    fault_table(
        f"workload 10x the CPU tier ({10 * CPU_MB} MB through a {CPU_MB} MB CPU tier, "
        "disk + Redis)",
        f"peak RSS +{growth / mb:.1f} MB over the warmed-up baseline "
        f"(bound {CPU_MB} + {MARGIN_MB} MB); +{first_half / mb:.1f} MB after half; "
        f"hits {stats['hits']}, misses {stats['misses']}",
        "n/a",
    )
