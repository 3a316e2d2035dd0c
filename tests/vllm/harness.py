"""One engine instance on CPU: vLLM's real Scheduler, connectors from the factory.

The model runner is replaced by the few lines of it that touch the EC
connector, in the order of the V1 mixin (``ec_connector_model_runner_mixin``)
or the V2 runner (``v1/worker/gpu/ec_connector.py``). The "encoder" is a
deterministic function of the item's identifier, and every run of it is
recorded, so a test can tell computed items from loaded ones.
"""

from __future__ import annotations

import copy
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch
from vllm.config import CacheConfig, ECTransferConfig, SchedulerConfig, VllmConfig
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ECConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from lmcache_ec.claims import claims_dir_for
from lmcache_ec.integration.vllm import connector as connector_module

IMAGE_TOKEN = 4
NUM_EMBEDS = 4  # tiny-blip2: num_query_tokens
HIDDEN = 64
BLOCK = 16


def image_hash(name: str) -> str:
    """A content-hash-shaped identifier, as vLLM's blake3 hasher produces."""
    return hashlib.sha256(name.encode()).hexdigest()


def encoder_output(identifier: str, weights_seed: int = 0) -> torch.Tensor:
    """The tiny "encoder": a function of the item and of the encoder weights."""
    seed = int(identifier.encode().hex()[:12], 16) if identifier else 0
    generator = torch.Generator().manual_seed((seed + 7919 * weights_seed) % (2**31))
    return torch.randn(NUM_EMBEDS, HIDDEN, generator=generator).to(torch.bfloat16)


class TinyVLM(torch.nn.Module):
    """A model with a vision tower (what is fingerprinted) and a language model."""

    def __init__(self, weights_seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(weights_seed)
        self.vision_tower = torch.nn.Linear(8, 8)
        self.language_model = torch.nn.Linear(8, 8)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def get_language_model(self) -> torch.nn.Module:
        return self.language_model


def step_until(engine: Engine, done: Callable[[], bool], max_steps: int = 400) -> None:
    """Steps ``engine`` until ``done()``; fails after ``max_steps`` steps."""
    for _ in range(max_steps):
        if done():
            return
        engine.step()
    raise AssertionError("condition not reached")


def held_until_gate(owner: object, method: str) -> threading.Event:
    """Makes ``owner.method`` wait until the returned gate opens (at most 60 s)."""
    gate = threading.Event()
    call = getattr(owner, method)

    def after_gate(*args, **kwargs):
        gate.wait(60)
        return call(*args, **kwargs)

    setattr(owner, method, after_gate)
    return gate


def hold_puts(engine: Engine, rank: int = 0) -> threading.Event:
    """Holds every put of ``rank``'s worker cache until the returned gate opens:
    an output that is still being encoded, as others see it."""
    return held_until_gate(engine.workers[rank].worker.cache, "put")


def orders_in_step_metadata(engine: Engine) -> None:
    """Stage orders and answers ride in step metadata (no stage channel)."""
    scheduler = engine.connector.scheduler
    scheduler.link.channel.close()
    scheduler.link.channel = None
    scheduler.deliver_on_idle = True  # the V2 runner runs the hooks in idle steps
    # The encoder weights come with the first step reports: nothing loads before.
    step_until(engine, lambda: scheduler.weights is not None)


def stored_by_a_producer(model_config, extra: dict, images: list[str]) -> None:
    """An ``ec_both`` instance encodes ``images`` and stores them in ``extra``'s tiers."""
    producer = Engine(make_vllm_config(model_config, "ec_both", extra))
    try:
        producer.run_until_finished([producer.add_request([image]) for image in images])
        producer.flush()
    finally:
        producer.shutdown()


def lone_request(identifier: str) -> Request:
    """A request with one image at offset 0, for a scheduler side used alone."""
    feature = MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=0, length=NUM_EMBEDS),
    )
    return Request(
        "r",
        [IMAGE_TOKEN] * NUM_EMBEDS + [5],
        SamplingParams(max_tokens=1),
        None,
        mm_features=[feature],
    )


_DIE_HOLDING_A_CLAIM = """
import os, sys
from lmcache_ec.claims import DirectoryClaims
assert DirectoryClaims(sys.argv[1]).claim(sys.argv[2], 600)
os._exit(0)  # dies: never encodes, never releases
"""


def claimed_by_a_dead_process(engine: Engine, image: str, disk_dir) -> None:
    """Another process claims ``image`` in the claims of ``disk_dir`` and dies
    holding it: ``engine`` (which must know its encoder weights, part of the
    name) waits for an output that never comes, up to ``claim_wait_s``."""
    name = engine.connector.scheduler.index.storage_name(image)
    claims = claims_dir_for(str(disk_dir))
    subprocess.run([sys.executable, "-c", _DIE_HOLDING_A_CLAIM, claims, name], check=True)


def make_vllm_config(
    model_config,
    role: str,
    extra: dict,
    tp_size: int = 1,
    kv_transfer_config=None,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    num_blocks: int = 64,
) -> VllmConfig:
    config = VllmConfig(
        kv_transfer_config=kv_transfer_config,
        model_config=copy.deepcopy(model_config),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=256,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        ec_transfer_config=ECTransferConfig(
            ec_connector="LMCacheECTierConnector",
            ec_role=role,
            ec_connector_extra_config=extra,
        ),
    )
    config.parallel_config.tensor_parallel_size = tp_size
    config.cache_config.num_gpu_blocks = num_blocks
    return config


class Engine:
    """Scheduler + one worker connector per tensor-parallel rank (per prefill
    context parallel slice: ``pcp_size`` slices of ``tp_size`` ranks each; the
    config's ``prefill_context_parallel_size`` is the test's to set)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        *,
        runner: str = "v2",
        tp_size: int = 1,
        pcp_size: int = 1,
        announce_weights: bool = True,
    ) -> None:
        self.vllm_config = vllm_config
        self.runner = runner
        kv = KVCacheConfig(
            num_blocks=vllm_config.cache_config.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(
                        block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.float32
                    ),
                )
            ],
        )
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.workers = []
        self.weights_seed = 0
        self.model = TinyVLM(self.weights_seed)
        for rank in range(tp_size * pcp_size):
            # vLLM builds each rank's connector inside its tensor-parallel group,
            # one group per PCP slice.
            place = connector_module.ParallelPosition(
                rank % tp_size, tp_size, 0, rank // tp_size, pcp_size
            )
            position = connector_module._parallel_position
            connector_module._parallel_position = lambda place=place: place
            try:
                worker = ECConnectorFactory.create_connector(vllm_config, ECConnectorRole.WORKER)
            finally:
                connector_module._parallel_position = position
            if announce_weights:  # what the Worker.load_model seam does
                worker.weights_changed(lambda: self.model)
            self.workers.append(worker)
        self.encoder_caches: list[dict[str, torch.Tensor]] = [{} for _ in self.workers]
        self.encoded: list[str] = []  # identifiers the encoder computed (rank 0)
        self.gathered: dict[str, torch.Tensor] = {}  # what the LM consumed
        self.features: dict[str, list[MultiModalFeatureSpec]] = {}
        self.finished: dict[str, str] = {}  # request id -> finish reason
        # SchedulerStats.ec_connector_stats: counters summed, feature-off levels the last
        self.ec_stats: dict[str, float] = {}
        self.scheduled: list[set[str]] = []  # per step: request ids given tokens
        self.stage_orders: list[list[str]] = []  # per step: prefetches sent to workers
        self.loads: list[list[str]] = []  # per step: items loaded from staging
        self._channel_orders: list[str] = []  # stage orders sent over the stage channel
        self.inflight_at_order: list[int] = []  # prefetches in flight as each order left
        channel = self.connector.scheduler.channel if self.connector is not None else None
        if channel is not None:
            send = channel.send

            def record(identifiers: list[str], weights: str = "", rows=None) -> bool:
                sent = send(identifiers, weights, rows)
                if sent:
                    self._channel_orders.extend(identifiers)
                    self.inflight_at_order.append(self.connector.scheduler.prefetch.inflight_items)
                return sent

            channel.send = record
        self._next = 0

    @property
    def connector(self):
        return self.scheduler.ec_connector

    def update_weights(self, weights_seed: int) -> None:
        """Change the encoder weights in place, as ``reload_weights`` does (then the
        runner's ``reset_encoder_cache`` seam tells the connectors)."""
        self.weights_seed = weights_seed
        with torch.no_grad():
            self.model.vision_tower.load_state_dict(TinyVLM(weights_seed).vision_tower.state_dict())
        for cache in self.encoder_caches:
            cache.clear()  # vLLM's own reset_encoder_cache
        self.scheduler.reset_encoder_cache()
        for worker in self.workers:
            worker.weights_changed(lambda: self.model)

    def add_request(
        self,
        identifiers: list[str],
        *,
        text_tokens: int = 4,
        max_tokens: int = 1,
        num_embeds: int = NUM_EMBEDS,
    ) -> str:
        prompt: list[int] = []
        features = []
        for identifier in identifiers:
            features.append(
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=identifier,
                    mm_position=PlaceholderRange(offset=len(prompt), length=num_embeds),
                    mm_hash=identifier,
                )
            )
            prompt += [IMAGE_TOKEN] * num_embeds
        prompt += [5] * text_tokens
        request_id = f"req-{self._next}"
        self._next += 1
        self.scheduler.add_request(
            Request(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(max_tokens=max_tokens),
                pooling_params=None,
                mm_features=features,
            )
        )
        return request_id

    # -- one step ------------------------------------------------------------

    def step(self) -> None:
        output = self.scheduler.schedule()
        self.scheduled.append(set(output.num_scheduled_tokens))
        meta = output.ec_connector_metadata
        orders = list(meta.stage) if meta is not None else []
        if orders:
            self.inflight_at_order.append(self.connector.scheduler.prefetch.inflight_items)
        self.stage_orders.append(orders + self._channel_orders)
        self._channel_orders = []
        self.loads.append(list(meta.loads) if meta is not None else [])
        # A forward pass (or an idle engine loop) takes time; staging runs meanwhile.
        time.sleep(0.005)
        for new in output.scheduled_new_reqs:
            self.features[new.req_id] = new.mm_features
        partial = self._partial_prefills(output)
        ec_outputs = [self._run_worker(rank, output) for rank in range(len(self.workers))]
        ec_output = None
        for item in ec_outputs:
            if item is None:
                continue
            if ec_output is None:
                ec_output = item
            elif item.ec_connector_worker_meta is not None:
                meta = ec_output.ec_connector_worker_meta
                ec_output.ec_connector_worker_meta = (
                    item.ec_connector_worker_meta
                    if meta is None
                    else meta.aggregate(item.ec_connector_worker_meta)
                )
        self._apply(output, partial, ec_output)

    def _partial_prefills(self, output) -> set[str]:
        """The requests given a chunk of a longer prompt: the model runner samples
        no token for them."""
        requests = self.scheduler.requests
        return {r for r in output.num_scheduled_tokens if requests[r].is_prefill_chunk}

    def _apply(self, output, partial: set[str], ec_output) -> None:
        """The scheduler's update with the step's results; finishes and counters kept."""
        req_ids = list(output.num_scheduled_tokens)
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[] if r in partial else [7] for r in req_ids],
            ec_connector_output=ec_output,
        )
        outputs = self.scheduler.update_from_output(output, runner_output)
        for client_outputs in outputs.values():
            stats = client_outputs.scheduler_stats
            for name, value in ((stats and stats.ec_connector_stats) or {}).items():
                level = name.startswith("feature_off:")  # the last one holds
                self.ec_stats[name] = value if level else self.ec_stats.get(name, 0) + value
            for item in client_outputs.outputs:
                if item.finish_reason is not None:
                    self.finished[item.request_id] = str(item.finish_reason)

    def _run_worker(self, rank: int, output) -> ECConnectorOutput | None:
        connector = self.workers[rank]
        cache = self.encoder_caches[rank]
        for identifier in output.free_encoder_mm_hashes:
            cache.pop(identifier, None)
        if self.runner == "v1" and not output.total_num_scheduled_tokens:
            return None  # V1 returns EMPTY_MODEL_RUNNER_OUTPUT without EC hooks
        connector.bind_connector_metadata(output.ec_connector_metadata)
        if connector.is_consumer:
            connector.start_load_caches(cache)
        before = set(cache)
        for req_id, inputs in output.scheduled_encoder_inputs.items():
            for index in inputs:
                identifier = self.features[req_id][index].identifier
                cache[identifier] = encoder_output(identifier, self.weights_seed)
                if rank == 0:
                    self.encoded.append(identifier)
                if self.runner == "v1":
                    connector.save_caches(encoder_cache=cache, mm_hash=identifier)
        gather = connector.is_consumer or not connector.is_producer  # no LM when encode-only
        if gather:
            self._gather(rank, output, cache)
        if self.runner == "v2" and connector.is_producer:
            for identifier in cache.keys() - before:
                connector.save_caches(encoder_cache=cache, mm_hash=identifier)
        result = ECConnectorOutput()
        result.finished_sending, result.finished_recving = connector.get_finished(
            output.finished_req_ids
        )
        result.ec_connector_worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        if self.runner == "v1" and not connector.is_consumer:
            return None  # V1's encode-only output (make_empty_encoder_model_runner_output)
        return result

    def _gather(self, rank: int, output, cache: dict[str, torch.Tensor]) -> None:
        """What ``_gather_mm_embeddings`` reads: the features overlapping the tokens
        scheduled this step (a chunk of a prefill needs only its own items)."""
        computed = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            start = computed[req_id]
            for feature in self.features.get(req_id, []):
                position = feature.mm_position
                if position.offset + position.length <= start:
                    continue  # computed in an earlier step
                if position.offset >= start + num_tokens:
                    continue  # in a later chunk
                if feature.identifier not in cache:
                    raise RuntimeError(f"Encoder cache miss for {feature.identifier}.")
                if rank == 0:
                    self.gathered[feature.identifier] = cache[feature.identifier]

    def run_until_finished(self, request_ids: list[str], max_steps: int = 1000) -> int:
        for steps in range(1, max_steps + 1):
            self.step()
            if all(r in self.finished for r in request_ids):
                return steps
        raise AssertionError(f"requests not finished after {max_steps} steps: {request_ids}")

    def flush(self) -> None:
        for worker in self.workers:
            assert worker.worker.flush(30.0)

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        for worker in self.workers:
            worker.shutdown()
