"""Engine step time with and without prefetch, for a batch mixing remote hits and local work.

One run, two modes, the same workload and the same Redis behind a proxy that
delays every command (``delay_ms``, as across a data centre):

- ``prefetch``: lmcache-ec's connector. A request whose image only Redis holds
  is deferred while a worker thread fetches it; the batch keeps stepping.
- ``in-step``: the same connector with ``in_step_reads`` on, the way a
  synchronous connector works: the scheduler approves the tier hit at once
  and the worker reads it from Redis inside the step, stalling the batch.

The engine is vLLM's real ``Scheduler`` with the worker-side connector calls
of the model runner; the forward pass and the encoder are sleeps of
``forward_ms`` per step and ``encode_ms`` per computed image.

Workload: ``busy`` text requests decoding all along, a request with an image
only Redis holds every ``remote_every`` steps and a request with a new image
(encoder runs) every ``local_every`` steps, ``arrivals`` requests in all.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlparse

import torch

from ..remote_names import redact
from .measure import percentile
from .proxy import SlowProxy
from .servers import local_redis
from .subjects import NO_MODEL

IMAGE_TOKEN = 4
BLOCK = 16


@dataclass
class StepBenchSettings:
    model_dir: str
    redis_url: str | None = None
    delay_ms: float = 50.0
    arrivals: int = 24
    busy: int = 4
    remote_every: int = 3
    local_every: int = 4
    forward_ms: float = 5.0
    encode_ms: float = 20.0
    item_shape: tuple[int, int] = (256, 2560)


def _image_hash(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def sim_item(
    vllm_config: Any, shape: tuple[int, int], generator: torch.Generator | None = None
) -> torch.Tensor:
    """An encoder output of ``shape``'s bytes in as many rows as the simulated
    requests have placeholders: one of other rows is refused when staged (vLLM
    could not place it)."""
    rows, cols = shape
    num_embeds = vllm_config.model_config.hf_config.num_query_tokens
    width = -(-rows * cols // num_embeds)
    return torch.randn(num_embeds, width, generator=generator).to(torch.bfloat16)


class SimEngine:
    """vLLM's Scheduler plus one worker-side connector, with sleeps for compute."""

    def __init__(self, vllm_config: Any, settings: StepBenchSettings, item: torch.Tensor) -> None:
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
        from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        spec = FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.float32
        )
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=KVCacheConfig(
                num_blocks=vllm_config.cache_config.num_gpu_blocks,
                kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec(["l"], spec)],
            ),
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.worker = ECConnectorFactory.create_connector(vllm_config, ECConnectorRole.WORKER)
        self.settings = settings
        self.item = item
        self.num_embeds = vllm_config.model_config.hf_config.num_query_tokens
        self.encoder_cache: dict[str, torch.Tensor] = {}
        self.features: dict[str, list[Any]] = {}
        self.finished: dict[str, float] = {}
        self.encoded: set[str] = set()
        self.encode_requests: list[str] = []  # one entry per encoder run, by request
        self.stats: dict[str, float] = {}

    def add(self, request_id: str, images: list[str], max_tokens: int) -> None:
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        prompt: list[int] = []
        features = []
        for image in images:
            position = PlaceholderRange(offset=len(prompt), length=self.num_embeds)
            features.append(
                MultiModalFeatureSpec(
                    data=None, modality="image", identifier=image, mm_position=position
                )
            )
            prompt += [IMAGE_TOKEN] * self.num_embeds
        prompt += [5] * 4
        self.scheduler.add_request(
            Request(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                pooling_params=None,
                mm_features=features,
            )
        )

    def step(self) -> tuple[float, float]:
        """One engine step: (wall seconds, seconds not spent in simulated compute)."""
        from vllm.v1.outputs import ECConnectorOutput, ModelRunnerOutput

        started = time.perf_counter()
        compute = 0.0
        output = self.scheduler.schedule()
        for new in output.scheduled_new_reqs:
            self.features[new.req_id] = new.mm_features
        for identifier in output.free_encoder_mm_hashes:
            self.encoder_cache.pop(identifier, None)
        self.worker.bind_connector_metadata(output.ec_connector_metadata)
        self.worker.start_load_caches(self.encoder_cache)
        for req_id, inputs in output.scheduled_encoder_inputs.items():
            for index in inputs:
                identifier = self.features[req_id][index].identifier
                time.sleep(self.settings.encode_ms / 1000)
                compute += self.settings.encode_ms / 1000
                self.encoded.add(identifier)
                self.encode_requests.append(req_id)
                self.encoder_cache[identifier] = self.item
                self.worker.save_caches(encoder_cache=self.encoder_cache, mm_hash=identifier)
        if output.total_num_scheduled_tokens:
            time.sleep(self.settings.forward_ms / 1000)
            compute += self.settings.forward_ms / 1000
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
        ended = time.perf_counter()
        for client_outputs in result.values():
            stats = client_outputs.scheduler_stats
            for name, value in ((stats and stats.ec_connector_stats) or {}).items():
                self.stats[name] = self.stats.get(name, 0) + value
            for item in client_outputs.outputs:
                if item.finish_reason is not None:
                    self.finished[item.request_id] = ended
        return ended - started, max(0.0, ended - started - compute)

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()


@contextlib.contextmanager
def _v2_runner_hooks() -> Iterator[None]:
    """Tell the connector the runner calls it in idle steps too, as vLLM's V2 runner does.

    Set after the config is built: VllmConfig refuses V2 without Triton.
    """
    previous = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = previous


def sim_vllm_config(
    model_dir: str,
    gpu_blocks: int,
    connector: dict[str, Any],
    *,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 512,
) -> Any:
    """The ``VllmConfig`` of a simulated engine (``SimEngine``) with lmcache-ec's
    connector as ``ec_both``; ``connector``: its extra config."""
    from vllm.config import (
        CacheConfig,
        ECTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=model_dir, tokenizer=model_dir, max_model_len=256, dtype="bfloat16"
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=256,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        ec_transfer_config=ECTransferConfig(
            ec_connector="LMCacheECTierConnector",
            ec_role="ec_both",
            ec_connector_extra_config={**connector, **NO_MODEL},
        ),
    )
    vllm_config.cache_config.num_gpu_blocks = gpu_blocks
    return vllm_config


def _run_mode(mode: str, settings: StepBenchSettings, redis_url: str) -> dict[str, Any]:

    from ..config import load_config
    from ..engine import ECCache
    from ..integration.vllm.identity import identity_from_vllm

    proxy = SlowProxy(urlparse(redis_url).port or 6379, settings.delay_ms / 1000)
    namespace = f"steps-{mode}-{uuid.uuid4().hex[:8]}"
    ec = {"max_local_cpu_size": 1.0, "remote_url": proxy.url, "namespace": namespace}
    vllm_config = sim_vllm_config(
        settings.model_dir,
        256,
        {
            "lmcache_config": ec,
            "remote_lookup_timeout_s": 5.0,
            "in_step_reads": mode == "in-step",
            "claim_encodes": False,  # one instance: nobody to share encodes with
        },
    )
    item = sim_item(vllm_config, settings.item_shape)
    remote_images = [_image_hash(f"{namespace}-remote-{i}") for i in range(settings.arrivals)]
    identity = identity_from_vllm(vllm_config, model=None, namespace=namespace)
    with ECCache(load_config(dict(ec, remote_url=redis_url)), identity) as seed:
        for image in remote_images:
            seed.put(image, item)
        seed.flush()

    with _v2_runner_hooks():
        engine = SimEngine(vllm_config, settings, item)
    if mode == "in-step":
        # Reading in the step is what this mode measures, not an error to log.
        logging.getLogger("lmcache_ec.integration.vllm.worker").setLevel(logging.CRITICAL)
    arrived: dict[str, tuple[str, float]] = {}
    step_times: list[float] = []
    overheads: list[float] = []
    try:
        for n in range(settings.busy):
            engine.add(f"busy-{n}", [], max_tokens=240)
        next_remote = next_local = 0
        step = 0
        deadline = time.monotonic() + 300
        while len(arrived) < settings.arrivals or not all(r in engine.finished for r in arrived):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: requests did not finish within 300 s")
            if len(arrived) < settings.arrivals and step % settings.remote_every == 0:
                request_id = f"remote-{next_remote}"
                engine.add(request_id, [remote_images[next_remote]], max_tokens=4)
                arrived[request_id] = ("remote", time.perf_counter())
                next_remote += 1
            if len(arrived) < settings.arrivals and step % settings.local_every == 1:
                request_id = f"local-{next_local}"
                engine.add(request_id, [_image_hash(f"{namespace}-local-{next_local}")], 4)
                arrived[request_id] = ("local", time.perf_counter())
                next_local += 1
            wall, overhead = engine.step()
            step_times.append(wall)
            overheads.append(overhead)
            step += 1
        latency: dict[str, list[float]] = {"remote": [], "local": []}
        for request_id, (kind, at) in arrived.items():
            latency[kind].append(engine.finished[request_id] - at)
        steps_ms = [t * 1000 for t in step_times]
        overhead_ms = [t * 1000 for t in overheads]
        return {
            "mode": mode,
            "steps": len(step_times),
            "step_median_ms": statistics.median(steps_ms),
            "step_p99_ms": percentile(steps_ms, 0.99),
            "step_max_ms": max(steps_ms),
            "wall_s": sum(step_times),
            # Step time outside the simulated forward pass and encoder: the stall.
            "overhead_median_ms": statistics.median(overhead_ms),
            "overhead_p99_ms": percentile(overhead_ms, 0.99),
            "overhead_max_ms": max(overhead_ms),
            "overhead_total_ms": sum(overhead_ms),
            "remote_request_median_ms": 1000 * statistics.median(latency["remote"]),
            "local_request_median_ms": 1000 * statistics.median(latency["local"]),
            "loads_read_inside_step": engine.stats.get("load_direct_reads", 0),
            "remote_hits": engine.stats.get("hits_remote", 0),
            "remote_images_encoded": len(engine.encoded.intersection(remote_images)),
        }
    finally:
        engine.shutdown()
        proxy.close()
        logging.getLogger("lmcache_ec.integration.vllm.worker").setLevel(logging.NOTSET)


def run_steps(settings: StepBenchSettings) -> dict[str, Any]:
    """Both modes on one Redis; the prefetch/in-step ratios of step times."""
    with contextlib.ExitStack() as stack:
        redis_url = settings.redis_url or stack.enter_context(local_redis())
        modes = {mode: _run_mode(mode, settings, redis_url) for mode in ("prefetch", "in-step")}
    ours, base = modes["prefetch"], modes["in-step"]
    return {
        "settings": {**asdict(settings), "redis_url": redact(settings.redis_url) or None},
        "modes": modes,
        "ratios": {
            "overhead_max_in_step_over_prefetch": base["overhead_max_ms"] / ours["overhead_max_ms"],
            "overhead_total_in_step_over_prefetch": base["overhead_total_ms"]
            / ours["overhead_total_ms"],
            "step_p99_in_step_over_prefetch": base["step_p99_ms"] / ours["step_p99_ms"],
            "step_max_in_step_over_prefetch": base["step_max_ms"] / ours["step_max_ms"],
            "local_request_in_step_over_prefetch": base["local_request_median_ms"]
            / ours["local_request_median_ms"],
        },
    }
