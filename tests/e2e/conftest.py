"""Real ``vllm serve`` processes with the connector, started once for ``tests/e2e``.

Every start costs about a minute of CPU, so the suite starts two waves of
servers, each wave in parallel:

1. writers, on empty tiers: ``a`` (ec_both, disk D + Redis), ``a_s3``
   (ec_both, own disk + S3) and ``producer`` (ec_producer, own disk + Redis in
   namespace ``epd``). Each encodes ``IMAGES`` once (cache misses) and is
   stopped (SIGTERM: the connector flushes its writes); ``a``'s answers are the
   reference every reader must reproduce.
2. readers, fresh processes: ``disk`` (ec_both on D, no remote), ``redis``
   (ec_both, empty disk, Redis), ``s3`` (ec_both, empty disk, S3) and
   ``consumer`` (ec_consumer, empty disk, Redis namespace ``epd``).

Readers keep running until the last test of ``tests/e2e``; each test uses its own images
so counters can be read as before/after deltas.

A test module that needs a server of its own (other tiers, another user's
directories) registers it with ``@companion(name)``; every companion of the
modules collected starts in the readers' wave, ``fleet.servers[name]``
beside the readers, with what its builder returned in
``fleet.companions[name]``. Servers started together share the CPU their
start-ups take: a lone start leaves one of two cores idle for about a minute.

Every server here holds a KV cache of ``KV_CACHE_BYTES`` instead of the 1 GiB
that ``bench serve`` gives its servers: the longest request here needs 32 MiB,
and the readers with the companions are seven servers at once.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lmcache_ec.bench.tiny_vlm import build_tiny_blip2
from lmcache_ec.bench.vllm_server import (
    CPU_ARGS,
    ChatResult,
    VLLMServer,
    chat_with_image,
    ec_transfer_config,
    make_png,
    metric_total,
    read_metrics,
)

# Image seeds: each reader test uses its own subset, so its counters are its own.
BUSY_IMAGES = (101, 102)
LONE_IMAGES = (103, 104)
CLI_IMAGES = (105,)
WEIGHT_IMAGES = (106,)
IMAGES = BUSY_IMAGES + LONE_IMAGES + CLI_IMAGES + WEIGHT_IMAGES
MAX_TOKENS = 6
# Long enough for a background decode that outlasts a test's requests (a
# decode step of the tiny model takes a few ms).
MAX_MODEL_LEN = 8192
BACKGROUND_TOKENS = 8000
# 4 KiB a token (2 layers, K and V, 256 float32 each): room for 4 requests of
# MAX_MODEL_LEN, against the 1 GiB (about a third of a server's memory) of CPU_ENV.
KV_CACHE_BYTES = 128 << 20
ARGS = (
    *CPU_ARGS[:-2],
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--kv-cache-memory-bytes",
    str(KV_CACHE_BYTES),
)
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def ask(server: VLLMServer, image: int, **kwargs) -> ChatResult:
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return chat_with_image(server.base_url, server.served_model, make_png(image), **kwargs)


def ask_all(server: VLLMServer, **kwargs) -> list[ChatResult]:
    """``IMAGES`` in order, one request at a time."""
    return [ask(server, image, **kwargs) for image in IMAGES]


def counters(server: VLLMServer) -> dict[str, float]:
    """The connector's and vLLM's counters that show encoder work and loads."""
    page = read_metrics(server.metrics_url)
    hits = {
        labels.get("tier", "?"): value
        for labels, value in page.get("vllm:lmcache_ec_hits_total", [])
    }
    return {
        "loads": metric_total(page, "vllm:lmcache_ec_loads_total"),
        "saves": metric_total(page, "vllm:lmcache_ec_saves_total"),
        "lookup_hits": metric_total(page, "vllm:lmcache_ec_lookup_hits_total"),
        "misses": metric_total(page, "vllm:lmcache_ec_misses_total"),
        "hits_disk": hits.get("disk", 0.0),
        "hits_cpu": hits.get("cpu", 0.0),
        "hits_lower": sum(v for t, v in hits.items() if t not in ("cpu", "disk")),
        # vLLM's own: prefix-cache hits would hide the encoder altogether.
        "prefix_cached_tokens": metric_total(page, "vllm:prompt_tokens_cached_total"),
        "requests_ok": metric_total(page, "vllm:request_success_total"),
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def settled_counters(
    server: VLLMServer,
    before: dict[str, float],
    requests: int,
    until: Callable[[dict[str, float]], bool] = lambda change: True,
) -> dict:
    """Deltas once ``requests`` more requests finished and ``until`` holds, or
    after 10 s (stats lag a step or two)."""
    deadline = time.monotonic() + 10
    while True:
        change = delta(counters(server), before)
        settled = change["requests_ok"] >= requests and until(change)
        if settled or time.monotonic() > deadline:
            time.sleep(0.5)  # the step after the last output carries its stats
            return delta(counters(server), before)
        time.sleep(0.2)


@dataclass
class Fleet:
    model: Path
    model_w2: Path  # the same model with other vision-tower weights
    disk_a: Path
    reference: dict[int, ChatResult]
    servers: dict[str, VLLMServer] = field(default_factory=dict)
    companions: dict[str, object] = field(default_factory=dict)
    start_s: dict[str, float] = field(default_factory=dict)
    writer_counters: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Site:
    """What a companion's builder gets: a directory of its own, the fleet's
    model and Redis, and the fleet's way to make a server (a core of its own)."""

    root: Path
    model: Path
    redis_url: str
    server: Callable[..., VLLMServer]  # (name, ec config, *, extra_args, env) -> server


Builder = Callable[[Site], tuple[VLLMServer, object]]
COMPANIONS: dict[str, Builder] = {}


def companion(name: str) -> Callable[[Builder], Builder]:
    """Register a module's own server, started with the fleet's readers."""

    def register(build: Builder) -> Builder:
        COMPANIONS[name] = build
        return build

    return register


def _ec(
    role: str, disk: Path, remote: dict | None = None, remote_timeout: float = 5.0, **extra
) -> dict:
    tiers = {
        "local_cpu": True,
        "max_local_cpu_size": 0.25,
        "local_disk": str(disk),
        "max_local_disk_size": 1.0,
        "remote_timeout": remote_timeout,
        **(remote or {}),
    }
    return ec_transfer_config(role, tiers, **extra)


def _start_all(servers: dict[str, VLLMServer], fleet: Fleet) -> None:
    for server in servers.values():
        server.launch()
    failures = []
    for name, server in servers.items():
        try:
            server.wait_ready()
            fleet.start_s[name] = server.started_s
        except Exception as exc:
            failures.append(f"[{name}] {exc}")
    if failures:
        for server in servers.values():
            server.stop()
        pytest.fail("\n\n".join(failures), pytrace=False)
    # The first forward of a process is slow (kernel set-up): pay it here, text
    # only. Not on a producer: it finishes requests once encoded, and text has none.
    generating = [s for n, s in servers.items() if n != "producer"]
    with ThreadPoolExecutor(len(generating)) as pool:
        list(
            pool.map(
                lambda s: chat_with_image(s.base_url, s.served_model, None, max_tokens=2),
                generating,
            )
        )


def _stop_all(servers: dict[str, VLLMServer]) -> None:
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda s: s.stop(), servers.values()))


# Package scope: the readers (about 2 GB of memory each) stop once the last
# e2e test ran, not at the end of the session, so the rest of the suite has
# that memory back.
@pytest.fixture(scope="package")
def fleet(redis_server, s3_server) -> Iterator[Fleet]:
    # Not under pytest's basetemp: concurrent pytest runs prune old basetemps
    # (keeping 3), which would delete the servers' disk tiers mid-session.
    root = Path(tempfile.mkdtemp(prefix="lmcache-ec-e2e-"))
    model = build_tiny_blip2(root / "models", seed=0)
    model_w2 = build_tiny_blip2(root / "models", seed=0, vision_seed=1)
    logs = root / "logs"
    bucket = s3_server.new_bucket()
    redis = {"remote_url": redis_server.url}
    s3 = {"remote_url": f"s3://{bucket}/e2e", "s3_endpoint_url": s3_server.endpoint}
    epd = {**redis, "namespace": "epd"}
    redis_server.client().flushall()
    # The servers read only the config given here, not the developer's LMCACHE_EC_*.
    env = {name: None for name in os.environ if name.startswith("LMCACHE_EC_")}
    # Unset, it leaves the KV cache's size to --kv-cache-memory-bytes (ARGS).
    env["VLLM_CPU_KVCACHE_SPACE"] = None
    env.update({"XDG_CACHE_HOME": str(root / "xdg"), **S3_ENV})

    cores = sorted(os.sched_getaffinity(0))
    started = itertools.count()

    def server(
        name: str, ec: dict, *, extra_args: tuple[str, ...] = ARGS, **more_env: str | None
    ) -> VLLMServer:
        # vLLM pins every CPU worker to the same core (its default binding); the
        # servers here start and run side by side, so each gets a core in turn
        # (three started together: ready in 98 s instead of 120 s). One OpenMP
        # thread each, as before: the numerics, hence the tokens compared, are
        # the same.
        core = cores[next(started) % len(cores)]
        return VLLMServer(
            model,
            logs / f"{name}.log",
            ec_config=ec,
            env={**env, "VLLM_CPU_OMP_THREADS_BIND": str(core), **more_env},
            extra_args=extra_args,
            ready_timeout=600,
        )

    fleet = Fleet(model=model, model_w2=model_w2, disk_a=root / "disk-a", reference={})
    writers = {
        "a": server("a", _ec("ec_both", root / "disk-a", redis)),
        "a_s3": server("a_s3", _ec("ec_both", root / "disk-a-s3", s3)),
        "producer": server("producer", _ec("ec_producer", root / "disk-p", epd)),
    }
    try:
        _start_all(writers, fleet)
        # Each writer gets the images one at a time, the writers side by side.
        more = {"producer": {"max_tokens": 1, "ignore_eos": False}}
        with ThreadPoolExecutor(len(writers)) as pool:
            answers = {
                name: pool.submit(ask_all, writer, **more.get(name, {}))
                for name, writer in writers.items()
            }
            fleet.reference = dict(zip(IMAGES, answers["a"].result(), strict=True))
            for answer in answers.values():
                answer.result()
        for name, writer in writers.items():
            fleet.writer_counters[name] = counters(writer)
    finally:
        _stop_all(writers)  # graceful: the connector flushes accepted writes

    # The defaults (a 50 ms remote lookup, 5 s to stage) turn a remote hit into
    # an encode when moto answers slowly on a loaded 2-core machine; these tests
    # are about loads, not about those bounds (tests/vllm covers them). A remote
    # call past remote_timeout pauses remote lookups for 5 s (the index's
    # backoff): every image asked meanwhile is encoded.
    patient = {"remote_lookup_timeout_s": 10.0, "stage_timeout_s": 30.0, "remote_timeout": 10.0}
    readers = {
        "disk": server("disk", _ec("ec_both", root / "disk-a")),
        "redis": server("redis", _ec("ec_both", root / "disk-b-redis", redis, **patient)),
        "s3": server("s3", _ec("ec_both", root / "disk-b-s3", s3, **patient)),
        "consumer": server("consumer", _ec("ec_consumer", root / "disk-c", epd, **patient)),
        # On D beside "disk"; its weights are reloaded in place (dev endpoints).
        "weights": server("weights", _ec("ec_both", root / "disk-a"), VLLM_SERVER_DEV_MODE="1"),
    }
    for name, build in COMPANIONS.items():
        site = Site(root / name, model, redis_server.url, server)
        site.root.mkdir()
        readers[name], fleet.companions[name] = build(site)
    fleet.servers = readers
    try:
        _start_all(readers, fleet)
        yield fleet
    finally:
        _stop_all(readers)
        print(f"\nvllm serve start-up seconds: {fleet.start_s}")
        if os.environ.get("EC_E2E_KEEP"):
            print(f"e2e files (logs, tiers) kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
