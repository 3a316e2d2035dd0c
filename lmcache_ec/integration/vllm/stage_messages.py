"""The stage channel's messages: one frozen dataclass per kind, and their frames.

A frame is a 4-byte big-endian length, then a JSON object of at most
``FRAME_MAX_BYTES``: ``{"kind": ..., <the fields of that kind>}``.

- ``StageOrder`` (scheduler → worker): stage ``ids``, ordered under ``weights``,
  each one of as many ``rows`` as its request's placeholders (a tensor of
  another length is refused: vLLM cannot place it);
- ``ReleaseOrder`` (scheduler → worker): drop the staged copies of ``ids``
  (sent on the link that carries the stage orders, so a release always
  reaches the worker before a later order for the same item);
- ``StageAnswer`` (worker → scheduler): how an order went (``staged``,
  ``failed``), under the ``weights`` it was made under, and which ``order``
  it answers: stage orders are numbered by their place on their link (1, 2,
  … in the order sent; both ends count), so that the answer to an order the
  scheduler gave up is never taken for a later order of the same item. 0: an
  answer that names no order (``StageLink.answer``);
- ``WeightsAnnouncement`` (worker → scheduler): the weights version keys use
  (None: unknown), on connect and after every change;
- ``WorkerReport`` (worker → scheduler): a step's saves, stagings, failures
  and counter deltas (``ECTierWorkerMetadata`` of one rank), with the number
  of the step-metadata order each staging or failure answers (``orders``).

``decode`` accepts nothing else: a kind it does not know, a missing field
(but one with a default) or an extra one, a value of the wrong type, a
number that is not finite or not of a sane size, a list or string past its
bound, a negative counter or order number, or JSON nested deeper than a
message is raise ``BadFrame`` — never another exception, whatever the bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .features_off import FEATURE_OFF

HEADER = struct.Struct("!I")
FRAME_MAX_BYTES = 8 * 1024 * 1024  # about 100,000 identifiers of 64 characters
MAX_IDS = 250_000  # per list
MAX_ID_CHARS = 4096
MAX_STATS = 1024
MAX_STAT_NAME_CHARS = 128
MAX_NUMBER = 2.0**63
_MAX_INT_DIGITS = 20


class BadFrame(ValueError):
    """A frame the channel refuses: the link it came on is closed."""


def _read_ids(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_IDS:
        raise BadFrame(f"'{name}' is not a list of at most {MAX_IDS} strings")
    for item in value:
        if not isinstance(item, str) or len(item) > MAX_ID_CHARS:
            raise BadFrame(f"'{name}' holds a {type(item).__name__} that is not an identifier")
    return tuple(value)


def _read_weights(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_ID_CHARS:
        raise BadFrame(f"'{name}' is not a weights version")
    return value


def _read_weights_or_unknown(value: Any, name: str) -> str | None:
    return None if value is None else _read_weights(value, name)


def _read_stats(value: Any, name: str) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > MAX_STATS:
        raise BadFrame(f"'{name}' is not a mapping of at most {MAX_STATS} counters")
    for key, number in value.items():
        counter = (
            isinstance(number, (int, float))
            and not isinstance(number, bool)
            and math.isfinite(number)
            and abs(number) < MAX_NUMBER
            # Counters only grow (Prometheus raises on a negative increment, inside
            # vLLM's output handler); a feature-off change is -1 when it comes back.
            and (number >= 0 or key.startswith(f"{FEATURE_OFF}:"))
        )
        if len(key) > MAX_STAT_NAME_CHARS or not counter:
            raise BadFrame(f"'{name}' holds {key[:40]!r}: {str(number)[:40]}, not a counter")
    return value


def _read_order(value: Any, name: str) -> int:
    """A stage order's number (0: none named)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_NUMBER:
        raise BadFrame(f"'{name}' is not an order number")
    return value


def _read_numbers_by_id(value: Any, name: str, what: str, least: int) -> dict[str, int]:
    """A mapping of identifiers to whole numbers from ``least`` on."""
    if not isinstance(value, dict) or len(value) > MAX_IDS:
        raise BadFrame(f"'{name}' is not a mapping of at most {MAX_IDS} {what}")
    for key, number in value.items():
        if len(key) > MAX_ID_CHARS:
            raise BadFrame(f"'{name}' holds a key that is not an identifier")
        if isinstance(number, bool) or not isinstance(number, int):
            raise BadFrame(f"'{name}' holds {str(number)[:40]}, not one of its {what}")
        if not least <= number < MAX_NUMBER:
            raise BadFrame(f"'{name}' holds {number}, out of the range of its {what}")
    return value


def _read_orders(value: Any, name: str) -> dict[str, int]:
    return _read_numbers_by_id(value, name, "order numbers", 0)


def _read_rows(value: Any, name: str) -> dict[str, int]:
    return _read_numbers_by_id(value, name, "row counts", 1)


def _wire(read: Callable[[Any, str], Any], **default: Any) -> Any:
    """A message field and the function that checks it on the way in (``default``
    or ``default_factory``: what a sender that does not set it sends)."""
    return dataclasses.field(metadata={"read": read}, **default)


@dataclass(frozen=True)
class StageOrder:
    KIND: ClassVar[str] = "stage"
    ids: tuple[str, ...] = _wire(_read_ids)
    weights: str = _wire(_read_weights)
    rows: Mapping[str, int] = _wire(_read_rows, default_factory=dict)  # unsaid: not checked


@dataclass(frozen=True)
class ReleaseOrder:
    KIND: ClassVar[str] = "release"
    ids: tuple[str, ...] = _wire(_read_ids)


@dataclass(frozen=True)
class StageAnswer:
    KIND: ClassVar[str] = "answer"
    staged: tuple[str, ...] = _wire(_read_ids)
    failed: tuple[str, ...] = _wire(_read_ids)
    weights: str = _wire(_read_weights)
    order: int = _wire(_read_order, default=0)


@dataclass(frozen=True)
class WeightsAnnouncement:
    KIND: ClassVar[str] = "weights"
    weights: str | None = _wire(_read_weights_or_unknown)


@dataclass(frozen=True)
class WorkerReport:
    KIND: ClassVar[str] = "report"
    saved: tuple[str, ...] = _wire(_read_ids)
    staged: tuple[str, ...] = _wire(_read_ids)
    failed: tuple[str, ...] = _wire(_read_ids)
    stats: Mapping[str, float] = _wire(_read_stats)
    weights: str | None = _wire(_read_weights_or_unknown)
    orders: Mapping[str, int] = _wire(_read_orders, default_factory=dict)


Message = StageOrder | ReleaseOrder | StageAnswer | WeightsAnnouncement | WorkerReport
TO_WORKER: tuple[type, ...] = (StageOrder, ReleaseOrder)
TO_SCHEDULER: tuple[type, ...] = (StageAnswer, WeightsAnnouncement, WorkerReport)


def encode(message: Message) -> bytes:
    """``message`` as one frame (header included); ``BadFrame`` if it cannot be one."""
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    try:
        body = json.dumps(
            {"kind": message.KIND, **fields}, separators=(",", ":"), allow_nan=False
        ).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as exc:
        raise BadFrame(f"{message.KIND}: {exc}") from None
    if len(body) > FRAME_MAX_BYTES:
        raise BadFrame(f"{message.KIND} of {len(body)} bytes is over {FRAME_MAX_BYTES}")
    return HEADER.pack(len(body)) + body


def decode(body: bytes, accepted: tuple[type, ...]) -> Message:
    """The message in a frame's body, of one of the ``accepted`` kinds."""
    if len(body) > FRAME_MAX_BYTES:
        raise BadFrame(f"frame of {len(body)} bytes is over {FRAME_MAX_BYTES}")
    try:
        document = json.loads(
            body.decode("utf-8", "surrogatepass"),
            parse_int=_parse_int,
            parse_constant=_refuse_constant,
        )
    except BadFrame:
        raise
    except (ValueError, RecursionError, OverflowError, MemoryError) as exc:
        raise BadFrame(f"not JSON: {type(exc).__name__}: {str(exc)[:80]}") from None
    if not isinstance(document, dict):
        raise BadFrame(f"not an object but {type(document).__name__}")
    kind = document.get("kind")
    cls = next((c for c in accepted if kind == c.KIND), None) if isinstance(kind, str) else None
    if cls is None:
        raise BadFrame(f"unexpected kind {str(kind)[:40]!r}")
    fields = dataclasses.fields(cls)
    required = {"kind", *(f.name for f in fields if not _has_default(f))}
    if not required <= set(document) <= {"kind", *(f.name for f in fields)}:
        raise BadFrame(f"{cls.KIND}: fields {sorted(document)[:12]!r:.200} are not its fields")
    return cls(
        **{
            f.name: f.metadata["read"](document[f.name], f.name)
            for f in fields
            if f.name in document
        }
    )


def _has_default(field: dataclasses.Field[Any]) -> bool:
    """A field a frame may leave out (one added since: what an older sender sends)."""
    return (
        field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    )


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise BadFrame(f"an integer of {len(text)} digits")
    return int(text)


def _refuse_constant(name: str) -> Any:
    raise BadFrame(f"{name} is not a number")
