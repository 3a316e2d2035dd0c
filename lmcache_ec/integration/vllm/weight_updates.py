"""Where vLLM changes a worker's weights, and the one place that listens.

``ECConnectorBase`` has no hook for weight updates: vLLM 0.32 and 0.33 reset
only their own encoder cache (``reset_encoder_cache``) after
``reload_weights`` or a ``pause_generation(clear_cache=True)``, and a
weight-transfer session (``start_weight_update`` … ``finish_weight_update``)
resets nothing. These methods are wrapped, at the class level, so that after
each of them the worker's EC connector takes a new fingerprint of the encoder
weights (``weights.py``):

- ``Worker.load_model`` — the model is resident (the initial fingerprint;
  ``start_worker_services`` runs there too but is not handed the model);
- ``Worker.start_weight_update`` — a session begins replacing the model's
  weights: they are unknown until it ends, so no output of a half-replaced
  encoder is saved under the old key and nothing is loaded meanwhile;
- ``Worker.finish_weight_update`` — a weight-transfer session ended;
- ``Worker.reset_weights`` — zeroes every weight (the RL API's
  ``/weight_checker`` reset);
- ``reset_encoder_cache`` of the V1 and V2 model runners — called by
  ``reload_weights`` and by the engine's ``reset_encoder_cache`` (pause with
  ``clear_cache``, the dev endpoint, RL frameworks after a weight sync);
- ``Worker.sleep`` — the weights are unknown from its start: the common RL
  loop (``sleep``, ``wake_up(["weights"])``, a weight sync through a
  ``collective_rpc`` of its own, ``wake_up(["kv_cache"])``) loads the new
  weights through none of the other seams, and the engine's cache reset ran
  before the sleep, on the old weights. They are fingerprinted at the next
  ``Worker.execute_model`` (a flag test per step): waking alone says nothing,
  since weights may be loaded after a ``wake_up`` of every tag. Until then the
  other seams leave them unknown and read nothing: a sleeping worker's weights
  may be off the device.

A load through none of these (a ``collective_rpc`` sync with no sleep before
it) must be followed by the engine's ``reset_encoder_cache``, which vLLM's own
encoder cache needs as well.

A draft-model session (``start_draft_weight_update``) does not pass through
``start_weight_update``: a draft shares only language-model modules with the
target (its embeddings and head), which the fingerprint leaves out, so loads
go on and the key stays. Its ``finish_weight_update`` still re-fingerprints:
a change that did reach the encoder is seen either way.

A missing seam (vLLM moved a method) is an error at start-up, not a silent
loss of weight tracking; ``tests/upstream`` pins each one.

One more seam is on the scheduler's side: ``Scheduler.reset_encoder_cache``
(the engine's ``reset_encoder_cache``) empties vLLM's encoder cache without
listing what it freed, so the EC connector's scheduler side is told
(``encoder_cache_reset``) and fetches those items again. Without it (one
warning) such items are found stale when vLLM next asks about them, and
computed once.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

# (module, class, method, kind): "worker" / "runner", how to reach the model from
# ``self`` to fingerprint it after the call; REPLACING: unknown after the call;
# ASLEEP: unknown before the call, fingerprinted at the next STEP (before it).
REPLACING = "replacing"
ASLEEP = "asleep"
STEP = "step"
SEAMS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm.v1.worker.gpu_worker", "Worker", "load_model", "worker"),
    ("vllm.v1.worker.gpu_worker", "Worker", "start_weight_update", REPLACING),
    ("vllm.v1.worker.gpu_worker", "Worker", "finish_weight_update", "worker"),
    ("vllm.v1.worker.gpu_worker", "Worker", "reset_weights", "worker"),
    ("vllm.v1.worker.gpu_worker", "Worker", "sleep", ASLEEP),
    ("vllm.v1.worker.gpu_worker", "Worker", "execute_model", STEP),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "reset_encoder_cache", "runner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "reset_encoder_cache", "runner"),
)
_MARK = "__lmcache_ec_seam__"
SCHEDULER_RESET = ("vllm.v1.core.sched.scheduler", "Scheduler", "reset_encoder_cache")


class _Slept:
    """Whether this process's worker slept since its last fingerprint (one worker
    per process, as one EC connector)."""

    due = False  # fingerprint at the next step; until then the weights stay unknown


class SeamError(RuntimeError):
    """A vLLM method this package listens on is gone."""


def _model_of(owner: Any, kind: str) -> Any:
    runner = owner.model_runner if kind == "worker" else owner
    return runner.get_model()


def _notify(owner: Any, kind: str) -> None:
    """Tell this process's EC connector that the weights may have changed."""
    from vllm.distributed.ec_transfer import get_ec_transfer, has_ec_transfer

    if not has_ec_transfer():
        return
    connector = get_ec_transfer()
    weights_changed = getattr(connector, "weights_changed", None)
    if weights_changed is None:
        return  # another EC connector
    unknown = kind in (REPLACING, ASLEEP) or _Slept.due  # asleep: nothing to read yet
    weights_changed(None if unknown else lambda: _model_of(owner, kind))


def _wrap(method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    if kind == ASLEEP:
        return _wrap_sleep(method)
    if kind == STEP:
        return _wrap_step(method)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        _notify(self, kind)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_sleep(method: Callable[..., Any]) -> Callable[..., Any]:
    """Unknown before the sleep starts: its offload (or a failure halfway) may
    leave the weights anything until the next step looks at them."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        _Slept.due = True
        _notify(self, ASLEEP)
        return method(self, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_step(method: Callable[..., Any]) -> Callable[..., Any]:
    """The first step after a sleep fingerprints the weights it runs with, before
    its loads and encoder: every rank of the group runs that step, so every rank
    joins the fingerprint's gather there."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _Slept.due:
            _Slept.due = False
            _notify(self, "worker")
        return method(self, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def missing() -> list[str]:
    """The seams vLLM no longer has, as ``module.Class.method``."""
    gone = []
    for module_name, class_name, method, _ in SEAMS:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            gone.append(f"{module_name}.{class_name}")
            continue
        if not callable(getattr(cls, method, None)):
            gone.append(f"{module_name}.{class_name}.{method}")
    return gone


def install() -> None:
    """Wrap every seam once per process; ``SeamError`` names any that are gone."""
    gone = missing()
    if gone:
        raise SeamError(
            "vLLM changed where weights are loaded or reset; lmcache-ec cannot see "
            f"weight updates without {', '.join(gone)}. Set ec_connector_extra_config "
            "weights_fingerprint: false and give ec.weights_version instead."
        )
    _Slept.due = False  # a new worker connector: its weights come from load_model
    for module_name, class_name, method, kind in SEAMS:
        cls = getattr(importlib.import_module(module_name), class_name)
        current = cls.__dict__.get(method)
        if current is None or getattr(current, _MARK, False):
            continue  # inherited (wrapped on its base) or already wrapped
        setattr(cls, method, _wrap(current, kind))
        logger.debug("Watching %s.%s.%s for weight changes", module_name, class_name, method)


def _tell_scheduler_side(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        reset = getattr(getattr(self, "ec_connector", None), "encoder_cache_reset", None)
        if reset is not None:  # None: another EC connector, or none
            reset()
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def install_scheduler_reset() -> bool:
    """Wrap ``Scheduler.reset_encoder_cache`` once per process; False if vLLM has none."""
    module_name, class_name, method = SCHEDULER_RESET
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return False
    current = cls.__dict__.get(method)
    if not callable(current):
        return False
    if not getattr(current, _MARK, False):
        setattr(cls, method, _tell_scheduler_side(current))
    return True
