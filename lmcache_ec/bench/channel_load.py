"""Step time the connector adds while the stage channel carries thousands of items a step.

``lmcache-ec bench channel``. vLLM's real ``Scheduler`` with Model Runner
V1's call pattern (no worker-side hook in a step with no tokens), a disk tier
in a temporary directory, and ``busy`` text requests decoding all along:

1. ``save``: one instance encodes ``items`` images in one step (62 a request)
   and saves them; its worker reports the saves in one report of ``items``
   identifiers, more than a socket buffer holds;
2. ``load``: a second instance asks for the same images: one step orders
   every one over the stage channel, then the scheduler stops for ``pause_s``
   (nothing reads the channel) while the worker answers; every request runs
   to its end, and every loaded tensor is compared with what was encoded.

Throughout, a hostile peer sits on each worker's socket: it sends half a
frame, never reads, and connects again whenever the worker drops it.

Measured per step: the seconds spent inside the connector's methods, on the
scheduler's side and the worker's (the forward pass is a sleep of
``forward_ms`` and the encoder a function of the identifier). Reported over
the steps in which requests were already running, where a wait delays others
and the connector's own waits are bounded by ``busy_stage_wait_s``: median,
p99 and max, next to ``busy_stage_wait_s`` + 1 ms.
"""

from __future__ import annotations

import hashlib
import math
import select
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .measure import percentile
from .steps import SimEngine, sim_vllm_config

IMAGES_PER_REQUEST = 62  # 4 tokens each, then 4 of text: within max_model_len (256)
PROMPT_TOKENS = IMAGES_PER_REQUEST * 4 + 4
BUSY_TOKENS = 240
HIDDEN = 64

# Hooks vLLM calls on each side (V1 mixin); their time is what the connector adds.
_SCHEDULER_HOOKS = (
    "ensure_cache_available",
    "take_unavailable_requests",
    "has_cache_item",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "get_ec_connector_stats",
)
_WORKER_HOOKS = (
    "bind_connector_metadata",
    "start_load_caches",
    "save_caches",
    "build_connector_worker_meta",
    "clear_connector_metadata",
    "get_finished",
)


@dataclass
class ChannelBenchSettings:
    model_dir: str
    items: int = 5000
    busy: int = 4
    pause_s: float = 2.0
    forward_ms: float = 5.0
    busy_stage_wait_s: float = 0.01
    hostile: bool = True


class HostilePeer:
    """Connects to a worker's stage socket, sends half a frame and never reads;
    connects again whenever the worker drops it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-peer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            peer = socket.socket(socket.AF_UNIX)
            try:
                peer.connect(self.path)
                self.connections += 1
                peer.sendall(struct.pack("!I", 1000) + b'{"kind":"stage","ids":["')
                while not self._stop.is_set() and _still_open(peer):
                    pass
            except OSError:
                self._stop.wait(0.05)
            finally:
                peer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _still_open(peer: socket.socket) -> bool:
    """Whether the other end still holds ``peer`` open (waits up to 50 ms); reads nothing."""
    poller = select.poll()
    poller.register(peer, select.POLLRDHUP)
    return not any(
        events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        for _, events in poller.poll(50)
    )


def encoder_output(identifier: str, rows: int) -> torch.Tensor:
    """The simulated encoder: a function of the identifier alone."""
    seed = int.from_bytes(hashlib.blake2b(identifier.encode(), digest_size=4).digest(), "big")
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HIDDEN, generator=generator).to(torch.bfloat16)


def _bit_equal(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return (
        a is not None
        and a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


class _Clock:
    """Seconds spent inside wrapped methods since ``reset``."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, owner: Any, names: tuple[str, ...]) -> None:
        for name in names:
            setattr(owner, name, self._timed(getattr(owner, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


class ChannelEngine(SimEngine):
    """``SimEngine`` stepped as Model Runner V1 does, timing the connector's hooks."""

    def __init__(self, vllm_config: Any, settings: ChannelBenchSettings) -> None:
        super().__init__(vllm_config, settings, torch.empty(0))
        self.clock = _Clock()
        self.clock.wrap(self.scheduler.ec_connector, _SCHEDULER_HOOKS)
        self.clock.wrap(self.worker, _WORKER_HOOKS)
        self.loaded: dict[str, bool] = {}  # identifier -> loaded bit-exact
        self.ordered: list[int] = []  # identifiers ordered over the channel, per step
        self._ordered_now = 0
        channel = self.scheduler.ec_connector.scheduler.channel
        send = channel.send

        def counted(
            identifiers: list[str], weights: str = "", rows: dict[str, int] | None = None
        ) -> int:
            sent = send(identifiers, weights, rows)
            self._ordered_now += len(identifiers) if sent else 0
            return sent

        channel.send = counted

    def step(self) -> tuple[float, float]:
        """One V1 step: (seconds inside the connector, 1.0 if requests were running)."""
        from vllm.v1.outputs import ECConnectorOutput, ModelRunnerOutput

        busy = 1.0 if self.scheduler.running else 0.0
        self.clock.seconds = 0.0
        self._ordered_now = 0
        output = self.scheduler.schedule()
        for new in output.scheduled_new_reqs:
            self.features[new.req_id] = new.mm_features
        for identifier in output.free_encoder_mm_hashes:
            self.encoder_cache.pop(identifier, None)
        ec_output = None
        if output.total_num_scheduled_tokens:  # V1 runs no EC hook in an empty step
            meta = output.ec_connector_metadata
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_caches(self.encoder_cache)
            for identifier in meta.loads:
                expected = encoder_output(identifier, self.num_embeds)
                self.loaded[identifier] = _bit_equal(self.encoder_cache.get(identifier), expected)
            for req_id, inputs in output.scheduled_encoder_inputs.items():
                for index in inputs:
                    identifier = self.features[req_id][index].identifier
                    self.encoded.add(identifier)
                    self.encoder_cache[identifier] = encoder_output(identifier, self.num_embeds)
                    self.worker.save_caches(encoder_cache=self.encoder_cache, mm_hash=identifier)
            time.sleep(self.settings.forward_ms / 1000)
            ec_output = ECConnectorOutput()
            ec_output.ec_connector_worker_meta = self.worker.build_connector_worker_meta()
            self.worker.clear_connector_metadata()
        req_ids = list(output.num_scheduled_tokens)
        result = self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[[7] for _ in req_ids],
                ec_connector_output=ec_output,
            ),
        )
        for client_outputs in result.values():
            stats = client_outputs.scheduler_stats
            for name, value in ((stats and stats.ec_connector_stats) or {}).items():
                self.stats[name] = self.stats.get(name, 0) + value
            for item in client_outputs.outputs:
                if item.finish_reason is not None:
                    self.finished[item.request_id] = time.perf_counter()
        self.ordered.append(self._ordered_now)
        return self.clock.seconds, busy


def _config(settings: ChannelBenchSettings, disk: str) -> Any:
    requests = math.ceil(settings.items / IMAGES_PER_REQUEST)
    extra = {
        "lmcache_config": {
            "max_local_cpu_size": 0.2,
            "local_disk": disk,
            "max_local_disk_size": 1.0,
        },
        "max_pending_saves": 2 * settings.items,
        "max_inflight_items": 2 * settings.items,
        "busy_stage_wait_s": settings.busy_stage_wait_s,
        "stage_timeout_s": 120.0,  # staging speed is not what this measures
        "claim_encodes": False,
    }
    return sim_vllm_config(
        settings.model_dir,
        (requests + settings.busy) * 17 + 64,
        extra,
        max_num_seqs=requests + settings.busy + 1,
        max_num_batched_tokens=requests * PROMPT_TOKENS + settings.busy * 8 + 64,
    )


def _run_phase(settings: ChannelBenchSettings, disk: str, images: list[str], phase: str) -> dict:
    from ..runtime_dirs import socket_path

    config = _config(settings, disk)
    engine = ChannelEngine(config, settings)
    path = socket_path(config.ec_transfer_config.engine_id, 0, 0, instance=config.instance_id)
    hostile = HostilePeer(path) if settings.hostile else None
    samples: list[tuple[float, float]] = []
    try:
        for n in range(settings.busy):
            engine.add(f"busy-{n}", [], max_tokens=BUSY_TOKENS)
        samples.append(engine.step())
        wave = []
        for start in range(0, len(images), IMAGES_PER_REQUEST):
            wave.append(f"{phase}-{start}")
            engine.add(wave[-1], images[start : start + IMAGES_PER_REQUEST], max_tokens=4)
        samples.append(engine.step())
        if phase == "load":
            time.sleep(settings.pause_s)  # the scheduler reads nothing meanwhile
        everyone = [*wave, *(f"busy-{n}" for n in range(settings.busy))]
        deadline = time.monotonic() + 600
        while not all(request in engine.finished for request in everyone):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{phase}: requests did not finish within 600 s")
            samples.append(engine.step())
        if phase == "save":
            engine.worker.worker.flush(120.0)
            engine.add("report", [], max_tokens=1)
            while "report" not in engine.finished:  # the step that reports the saves
                samples.append(engine.step())
    finally:
        if hostile is not None:
            hostile.stop()
        engine.shutdown()
    return {
        "samples": samples,
        "largest_order_step": max(engine.ordered),
        "requests_finished": sum(request in engine.finished for request in wave),
        "requests": len(wave),
        "encoded": len(engine.encoded.intersection(images)),
        "loaded": len(engine.loaded),
        "loaded_bit_exact": sum(engine.loaded.values()),
        "hostile_connections": hostile.connections if hostile is not None else 0,
        "counters": {
            name: value
            for name, value in engine.stats.items()
            if "channel" in name or name in ("saves_submitted", "loads", "load_direct_reads")
        },
    }


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    busy_ms = [1000 * seconds for seconds, busy in samples if busy]
    idle_ms = [1000 * seconds for seconds, busy in samples if not busy]
    return {
        "steps": len(samples),
        "busy_steps": len(busy_ms),
        "busy_median_ms": statistics.median(busy_ms) if busy_ms else 0.0,
        "busy_p99_ms": percentile(busy_ms, 0.99) if busy_ms else 0.0,
        "busy_max_ms": max(busy_ms, default=0.0),
        # The p99 of ~480 steps is the 5th largest: the few steps that take a
        # whole batch's bookkeeping decide whether it is.
        "busy_largest_ms": sorted(busy_ms, reverse=True)[:8],
        "idle_steps": len(idle_ms),
        "idle_max_ms": max(idle_ms, default=0.0),
    }


def run_channel(settings: ChannelBenchSettings) -> dict[str, Any]:
    """Both phases; the connector's time per busy step against its budget."""
    images = [
        hashlib.sha256(f"bench-channel-{i}".encode()).hexdigest() for i in range(settings.items)
    ]
    with tempfile.TemporaryDirectory(prefix="lmcache-ec-bench-channel-") as disk:
        phases = {phase: _run_phase(settings, disk, images, phase) for phase in ("save", "load")}
    samples: list[tuple[float, float]] = []
    for phase in phases.values():
        samples += phase["samples"]
        phase.update(_summary(phase.pop("samples")))
    summary = _summary(samples)
    target_ms = 1000 * settings.busy_stage_wait_s + 1.0
    return {
        "settings": asdict(settings),
        "phases": phases,
        "all": summary,
        "target_ms": target_ms,
        "p99_within_target": summary["busy_p99_ms"] <= target_ms,
    }
