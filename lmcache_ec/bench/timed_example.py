"""vLLM's ``ECExampleConnector`` with the timeline of ``integration/vllm/timeline.py``.

``bench serve`` runs it in place of the plain class to decompose the example's
TTFT like lmcache-ec's: it only records (a dict write per hook; one line per
finished request and per load), then does exactly what the example does.
Its ``lookup`` is the example's ``has_cache_item`` (a file check), and its
``scheduled`` the example's load order; it has no staging.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.ec_transfer.ec_connector.example_connector import ECExampleConnector

from ..integration.vllm.timeline import SchedulerTimeline, WorkerTimeline

TIMELINE_KEY = "timeline_path"  # in ec_connector_extra_config


class TimedExampleConnector(ECExampleConnector):
    def __init__(self, vllm_config: Any, role: Any) -> None:
        super().__init__(vllm_config, role)
        path = vllm_config.ec_transfer_config.get_from_extra_config(TIMELINE_KEY, None)
        self._scheduler_timeline = SchedulerTimeline(path) if path else None
        self._worker_timeline = WorkerTimeline(path, 0) if path else None
        self._allocating = False

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if self._scheduler_timeline is not None:
            self._scheduler_timeline.seen(request.request_id)
        return super().ensure_cache_available(request, num_computed_tokens)

    def has_cache_item(self, identifier: str) -> bool:
        found = super().has_cache_item(identifier)
        if self._scheduler_timeline is not None and not self._allocating:
            self._scheduler_timeline.item(identifier, "lookup")
        return found

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self._allocating = True  # the example asks has_cache_item again: not a lookup
        try:
            super().update_state_after_alloc(request, index)
        finally:
            self._allocating = False
        identifier = request.mm_features[index].identifier
        if self._scheduler_timeline is not None and identifier in self._mm_datas_need_loads:
            self._scheduler_timeline.item(identifier, "scheduled")

    def start_load_caches(self, encoder_cache: Any, **kwargs: Any) -> None:
        super().start_load_caches(encoder_cache, **kwargs)
        if self._worker_timeline is not None:
            for mm_data in self._get_connector_metadata().mm_datas:
                self._worker_timeline.item(mm_data.mm_hash, "loaded")

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler_timeline is not None:
            self._scheduler_timeline.finished(request)
        return super().request_finished(request)


__all__ = ["TimedExampleConnector"]
