"""``LMCacheECTierConnector``: vLLM's ECConnector over the lmcache-ec tier.

One instance per process and role. The scheduler-side instance
(``TierScheduler`` + ``TierIndex``) holds no ECCache and does no network I/O
on the scheduling path; the worker-side instance (``TierWorker``) owns the
ECCache built from ``lmcache_config`` / ``$LMCACHE_CONFIG_FILE``. Roles:

- ``ec_producer``: encode-only; saves what it computes, skips what the tiers
  already hold, never loads.
- ``ec_consumer``: loads what the tiers hold, never saves.
- ``ec_both``: both — one instance reusing its own and others' outputs.

Options: see ``settings.py``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from ...claims import ClaimAgent
from ...config import ConfigError, ECConfig, load_config
from ...engine import ECCache
from ...runtime_dirs import Feature, RuntimeDirUnavailable, feature_off, socket_path
from ...storage.single_flight import claim_store_factory
from . import weight_updates
from .channel import StageListener
from .connector_options import ConnectorSettings
from .features_off import OffLevels
from .identity import identity_from_vllm
from .index import TierIndex
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .scheduler import TierScheduler
from .stage_client import StageClient
from .stage_messages import WeightsAnnouncement
from .stats import ECTierConnectorStats, ECTierPromMetrics
from .switch_interval import SwitchInterval
from .timeline import SchedulerTimeline, WorkerTimeline
from .weights import tp_gather, weights_fingerprint
from .worker import TierWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ECConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


def _open_catalog_factory(config: ECConfig) -> Any:
    """A callable opening the remote catalog, or None without a ``remote_url`` store."""
    if config.remote.url is None:
        return None

    def open_catalog() -> Any:
        try:
            from ...remote.catalog import open_catalog as _open
        except ImportError:
            logger.warning("lmcache_ec.remote.catalog unavailable; remote tier not indexed")
            return None
        return _open(config)

    return open_catalog


class ParallelPosition(NamedTuple):
    """Where a worker stands among the workers that run the EC hooks.

    Those are every first-pipeline-stage worker: each prefill-context-parallel
    (PCP) slice has its own tensor-parallel group, so two workers of one engine
    can share a tensor-parallel rank. The connector counts them all as ranks.
    """

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pcp_rank: int = 0
    pcp_size: int = 1

    @property
    def rank(self) -> int:
        """This worker's index among the ``ranks`` that stage, answer and write."""
        return self.pcp_rank * self.tp_size + self.tp_rank

    @property
    def ranks(self) -> int:
        return self.tp_size * self.pcp_size


def _pcp_position() -> tuple[int, int]:
    """(PCP rank, PCP size) of this worker; (0, 1) where vLLM has no PCP group."""
    try:
        from vllm.distributed.parallel_state import get_pcp_group

        group = get_pcp_group()
        return group.rank_in_group, group.world_size
    except Exception as exc:  # an older vLLM, or no group: one slice
        logger.debug("No prefill-context-parallel group: %s", exc)
    return 0, 1


def _parallel_position() -> ParallelPosition:
    """This worker's position; (0 of 1) everywhere if none: every process writes,
    duplicates, never gaps."""
    try:
        from vllm.distributed.parallel_state import (
            get_pp_group,
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
            model_parallel_is_initialized,
        )

        if model_parallel_is_initialized():
            return ParallelPosition(
                get_tensor_model_parallel_rank(),
                get_tensor_model_parallel_world_size(),
                get_pp_group().rank_in_group,
                *_pcp_position(),
            )
    except Exception as exc:
        logger.debug("No tensor-parallel group: %s", exc)
    return ParallelPosition()


def _worker_ranks(vllm_config: VllmConfig) -> int:
    """How many workers run the EC hooks: a first pipeline stage, TP x PCP."""
    parallel = vllm_config.parallel_config
    pcp_size = getattr(parallel, "prefill_context_parallel_size", 1) or 1
    return max(1, parallel.tensor_parallel_size) * max(1, pcp_size)


def _stage_socket(vllm_config: VllmConfig, node_dir: str, rank: int) -> str:
    """The stage channel's socket of one rank (``ParallelPosition.rank``) of this
    engine (see ``channel.py``); ``RuntimeDirUnavailable`` where this user can have
    no directory for it.

    Named by the engine id and vLLM's ``instance_id``: set anew by each
    ``VllmConfig`` and pickled with it to the engine core and its workers, so
    two engines launched with one engine id never share a socket.
    """
    engine_id = vllm_config.ec_transfer_config.engine_id or "engine"
    dp_rank = getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0
    instance = str(getattr(vllm_config, "instance_id", "") or "")
    return socket_path(engine_id, dp_rank, rank, node_dir, instance=instance)


def _warn_if_killed_at_shutdown(vllm_config: VllmConfig, close_timeout: float) -> None:
    """vLLM's ``shutdown_timeout`` 0 (its default) kills the engine processes at
    SIGTERM before any connector shuts down: writes still queued then are lost."""
    if getattr(vllm_config, "shutdown_timeout", None) == 0:
        logger.warning(
            "vLLM's shutdown_timeout is 0: at SIGTERM vLLM kills the engine without "
            "shutting the EC connector down, and encoder outputs still being written "
            "then are lost (computed again when next asked for). Pass "
            "--shutdown-timeout %d (close_timeout) to let it write them",
            math.ceil(close_timeout),
        )


def _bytes_per_embed(vllm_config: VllmConfig) -> int:
    """Bytes of one encoder-output row, for the prefetch byte bound (0: unknown)."""
    try:
        model_config = vllm_config.model_config
        itemsize = torch.empty(0, dtype=model_config.dtype).element_size()
        return int(model_config.get_inputs_embeds_size()) * itemsize
    except Exception as exc:  # an exotic config: bound prefetches by count only
        logger.debug("No encoder-output row size: %s", exc)
        return 0


class LMCacheECTierConnector(ECConnectorBase):
    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        transfer = vllm_config.ec_transfer_config
        self.settings = ConnectorSettings.from_extra_config(transfer.ec_connector_extra_config)
        config = load_config(self.settings.lmcache_config)
        self.identity = identity_from_vllm(
            vllm_config,
            model=self.settings.model,
            namespace=config.namespace,
            weights=config.weights_version,
        )
        self.scheduler: TierScheduler | None = None
        self.worker: TierWorker | None = None
        self._close_timeout = config.close_timeout  # the scheduler side's shutdown bound
        # A loading instance's threads must get the GIL from vLLM's spinning waits.
        self._switch_interval = SwitchInterval()
        if self.is_consumer:
            self._switch_interval.lower()
        self._listener: StageListener | None = None
        self._off_levels = OffLevels()  # scheduler: the features off of every process
        fingerprint = self.settings.weights_fingerprint
        if role == ECConnectorRole.SCHEDULER:
            ranks = _worker_ranks(vllm_config)
            try:
                paths = [_stage_socket(vllm_config, config.node_dir, r) for r in range(ranks)]
                channel, no_channel = StageClient(paths), None
            except RuntimeDirUnavailable as exc:
                channel, no_channel = None, exc
            index = TierIndex(
                self.identity,
                disk_dir=config.local_disk,
                open_catalog=_open_catalog_factory(config),
                negative_ttl=self.settings.negative_lookup_ttl_s,
                purge_check_s=config.purge_check_s,
            )
            open_claims = claim_store_factory(config) if self.settings.claim_encodes else None
            self.scheduler = TierScheduler(
                self.settings,
                index,
                is_producer=self.is_producer,
                is_consumer=self.is_consumer,
                tp_size=ranks,  # every rank stages an item before it is READY
                deliver_on_idle=bool(getattr(vllm_config, "use_v2_model_runner", False)),
                bytes_per_embed=_bytes_per_embed(vllm_config),
                channel=channel,
                weights_from_workers=fingerprint,
                # Only an instance that both encodes (and saves) and loads waits
                # for others' encodes.
                claims=(
                    ClaimAgent(open_claims, self.settings.claim_wait_s)
                    if open_claims is not None and self.is_producer and self.is_consumer
                    else None
                ),
            )
            if no_channel is not None:
                self.scheduler.channel_unavailable(no_channel, self._without_channel())
            if not weight_updates.install_scheduler_reset():
                logger.warning(
                    "vLLM has no Scheduler.reset_encoder_cache to watch: after an encoder "
                    "cache reset, an item asked for again is computed once before it loads"
                )
            if config.timeline_path:
                self.scheduler.timeline = SchedulerTimeline(config.timeline_path)
        else:
            if fingerprint:
                try:
                    weight_updates.install()
                except weight_updates.SeamError as exc:
                    raise ConfigError(str(exc)) from None
            cache = ECCache(config, self.identity)
            position = _parallel_position()
            self.worker = TierWorker(
                cache,
                self.settings,
                persistable=self.settings.persistable,
                is_producer=self.is_producer,
                is_consumer=self.is_consumer,
                tp_rank=position.rank,
                tp_size=position.ranks,
                device=getattr(vllm_config.device_config, "device", None) or "cpu",
                weights_known=not fingerprint,
            )
            if config.timeline_path:
                self.worker.timeline = WorkerTimeline(config.timeline_path, position.rank)
            if self.is_producer and position.rank == 0:
                _warn_if_killed_at_shutdown(vllm_config, config.close_timeout)
            if position.pp_rank == 0:  # only the first pipeline stage runs the encoder
                try:
                    self._listener = StageListener(
                        _stage_socket(vllm_config, config.node_dir, position.rank),
                        self._on_stage_order,
                        self._hello,
                        on_release=self._on_release_order,
                    )
                except RuntimeDirUnavailable as exc:
                    self.worker.feature_off(Feature.STAGE_CHANNEL, exc.reason)
                    feature_off(Feature.STAGE_CHANNEL, exc, self._without_channel())
                except OSError as exc:
                    logger.warning("No stage channel (%s); orders go with step metadata", exc)

    def _without_channel(self) -> str:
        """What an engine without a stage channel does instead (for the warning)."""
        text = (
            "Stage orders and worker reports ride in step metadata (on Model Runner V1 "
            "a request arriving at an idle engine is then encoded)"
        )
        if self.settings.weights_fingerprint:
            text += (
                "; the scheduler learns the encoder weights fingerprint from the workers' "
                "first step report and caches nothing before it"
            )
        return text

    # -- worker side: weights and the stage channel ---------------------------

    def _weights_version(self, fingerprint: str | None) -> str | None:
        """``ec.weights_version`` and the fingerprint, as keys carry them."""
        if fingerprint is None:
            return None
        return "/".join(part for part in (self.identity.weights, fingerprint) if part)

    def weights_changed(self, model: Callable[[], torch.nn.Module] | None) -> None:
        """Worker: the weights may have changed (``weight_updates.py``); re-key if they did.

        ``model`` None: they are being replaced, and unknown until the next
        call. The new version reaches the scheduler over the stage channel
        before this returns. A failed fingerprint makes the weights unknown:
        nothing is loaded or saved until the next one succeeds. ``model`` is
        called inside the fingerprint: a rank where it raises still joins the
        tensor-parallel gather its peers wait in.
        """
        if self.worker is None or not self.settings.weights_fingerprint:
            return
        started = time.perf_counter()
        try:
            version = (
                None
                if model is None
                else self._weights_version(weights_fingerprint(model, tp_gather()))
            )
        except Exception as exc:
            logger.error("Encoder weights fingerprint failed (%s); loads and saves paused", exc)
            version = None
        seconds = time.perf_counter() - started
        self.worker.record("fingerprint_seconds", seconds)
        if self.worker.set_weights(version) and self._listener is not None:
            self._listener.broadcast(WeightsAnnouncement(version))
        if model is None:
            logger.info("Encoder weights being replaced: loads and saves wait for the next")
        else:
            logger.info("Encoder weights fingerprint %s (%.3f s)", version, seconds)

    def _hello(self) -> WeightsAnnouncement:
        return WeightsAnnouncement(self.worker.weights if self.worker is not None else None)

    def _on_stage_order(
        self, identifiers: list[str], weights: str, link: Any, rows: dict[str, int]
    ) -> None:
        assert self.worker is not None
        self.worker.stage(identifiers, weights, link, rows=rows)

    def _on_release_order(self, identifiers: list[str]) -> None:
        assert self.worker is not None
        self.worker.release(identifiers)

    # -- worker side ---------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Worker: release, load this step's items (one batch), queue staging."""
        assert self.worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, ECTierConnectorMetadata)
        self.worker.start_load_caches(encoder_cache, meta)

    def save_caches(
        self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any
    ) -> None:
        """Worker: hand ``encoder_cache[mm_hash]`` to the background writer."""
        assert self.worker is not None
        self.worker.save_caches(encoder_cache, mm_hash)

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        """Worker: saves, staging results and counter deltas of this step.

        Queued on the stage channel when a scheduler is connected (vLLM drops
        worker metadata in an encode-only instance's steps on V1); in the step's
        metadata when no link took it.
        """
        if self.worker is None:
            return None
        if self._listener is not None:
            for name, value in self._listener.take_counts().items():
                self.worker.record(name, value)
        meta = self.worker.build_worker_meta()
        delivered = (
            meta is not None
            and self._listener is not None
            and self._listener.broadcast(meta.to_report())
        )
        return None if delivered else meta

    # -- scheduler side ------------------------------------------------------

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        """Scheduler: False while the request waits for items being staged."""
        assert self.scheduler is not None
        if self.scheduler.timeline is not None:
            self.scheduler.timeline.seen(request.request_id)
        return self.scheduler.ensure_cache_available(request, num_computed_tokens)

    def take_unavailable_requests(self) -> set[str]:
        """Scheduler: requests of an ec_consumer whose items could not be fetched."""
        assert self.scheduler is not None
        return self.scheduler.take_unavailable_requests()

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """Scheduler: forget the request's prefetch waits."""
        if self.scheduler is not None:
            self.scheduler.request_finished(request.request_id)
            if self.scheduler.timeline is not None:
                self.scheduler.timeline.finished(request)
        return False, None

    def has_cache_item(self, identifier: str) -> bool:
        """Scheduler: in-memory answer; True only for items ready to load."""
        assert self.scheduler is not None
        return self.scheduler.has_cache_item(identifier)

    def encoder_cache_reset(self) -> None:
        """Scheduler: vLLM emptied its encoder cache (``weight_updates.py``)."""
        if self.scheduler is not None:
            self.scheduler.encoder_cache_reset()

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        """Scheduler: turn approved items into loads; computed items are ignored."""
        assert self.scheduler is not None
        self.scheduler.update_state_after_alloc(request, index)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECTierConnectorMetadata:
        """Scheduler: this step's stage/load/release orders."""
        assert self.scheduler is not None
        return self.scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: ECConnectorOutput) -> None:
        """Scheduler: learn from the workers' aggregated metadata."""
        if self.scheduler is None:
            return
        meta = connector_output.ec_connector_worker_meta
        if meta is not None and not isinstance(meta, ECTierWorkerMetadata):
            logger.warning("Ignoring foreign EC worker metadata %s", type(meta).__name__)
            return
        self.scheduler.update_connector_output(meta)

    # -- stats ---------------------------------------------------------------

    def get_ec_connector_stats(self) -> ECTierConnectorStats | None:
        """Scheduler: worker and scheduler counters since the last call.

        Workers report through their step metadata (not here), so the V1
        mixin, which does not collect worker stats, loses nothing and the V2
        runner, which does, counts nothing twice. Features off go as levels
        (``features_off.OffLevels``).
        """
        if self.scheduler is None:
            return None
        stats = ECTierConnectorStats(data=self._off_levels.apply(self.scheduler.take_stats()))
        return None if stats.is_empty() else stats

    @classmethod
    def build_ec_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> ECTierConnectorStats | None:
        return ECTierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> ECTierPromMetrics:
        return ECTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        self._switch_interval.restore()
        if self._listener is not None:
            self._listener.close()
        if self.worker is not None:
            self.worker.close()
        if self.scheduler is not None:
            self.scheduler.close(self._close_timeout)
