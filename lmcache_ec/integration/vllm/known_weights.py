"""The encoder weights the scheduler keys items under, and why caching is paused.

Items are keyed under the encoder-weights fingerprint the workers announce
(over the stage channel; without one, in their step reports), or under
``ec.weights_version`` when the workers do not fingerprint. Until the
fingerprint is known nothing is looked up: caching is paused, and the
``caching`` feature reads off in the stats, with why (``caching_paused``):
no worker has reported one yet, or none can (no stage channel, and Model
Runner V1 drops an encode-only instance's step reports; one warning says
what to change). The stage channel, when it could not start, reads off too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from ...runtime_dirs import Feature, RuntimeDirUnavailable, feature_off
from .features_off import OffChanges
from .index import TierIndex

logger = logging.getLogger(__name__)

CACHING = "caching"  # the feature paused while the encoder weights are not known
# Why caching is paused: no worker has reported a fingerprint yet (or the
# last one failed); or none can: no stage channel, and Model Runner V1 drops
# an encode-only instance's step reports.
WEIGHTS_UNKNOWN = "weights_unknown"
WEIGHTS_UNREACHABLE = "weights_unreachable"
_UNREACHABLE_HELP = (
    "no stage channel reaches every worker rank, and Model Runner V1 drops an "
    "encode-only instance's worker reports, so the encoder weights fingerprint never "
    "reaches the scheduler and every item is encoded. Run every rank on the scheduler's "
    "node with a private runtime directory, or set weights_fingerprint: false and "
    "ec.weights_version"
)


class KnownWeights:
    """One scheduler's knowledge of its workers' encoder weights."""

    def __init__(
        self, index: TierIndex, *, from_workers: bool, reports_arrive: Callable[[], bool]
    ) -> None:
        self.index = index
        self._base_identity = index.identity
        # The weights version keys use; None until the workers announce one.
        self.current: str | None = None if from_workers else index.identity.weights
        # Whether the workers' reports, and the fingerprint in them, reach this side.
        self._reports_arrive = reports_arrive
        self._off: dict[str, str] = {}  # features off on this side: name -> reason
        self._off_changes = OffChanges()
        self._unreachable_told = False

    def change(self, weights: str | None) -> bool:
        """The workers' encoder weights are now ``weights`` (None: unknown); False if
        they already were. The index keys its lookups under them from now on."""
        if weights == self.current:
            return False
        logger.info("Encoder weights %s -> %s", self.current, weights)
        self.current = weights
        self.index.set_identity(dataclasses.replace(self._base_identity, weights=weights or ""))
        return True

    def caching_paused(self) -> str | None:
        """Why nothing is looked up now (``WEIGHTS_*``), or None."""
        if self.current is not None:
            return None
        return WEIGHTS_UNKNOWN if self._reports_arrive() else WEIGHTS_UNREACHABLE

    def channel_unavailable(self, error: RuntimeDirUnavailable, consequence: str) -> None:
        """No stage channel: no private directory for its sockets (one warning)."""
        self._off[Feature.STAGE_CHANNEL.value] = error.reason.value
        feature_off(Feature.STAGE_CHANNEL, error, consequence)
        self._tell_if_unreachable()

    def _tell_if_unreachable(self) -> None:
        """One warning when the fingerprint can never reach this side."""
        if self.caching_paused() == WEIGHTS_UNREACHABLE and not self._unreachable_told:
            self._unreachable_told = True
            logger.warning("Caching paused: %s", _UNREACHABLE_HELP)

    def take_off_changes(self) -> dict[str, float]:
        """The changes of the features off on this side since the last call
        (``features_off.OffChanges``)."""
        off = dict(self._off)
        paused = self.caching_paused()
        if paused is not None:
            off[CACHING] = paused
        self._tell_if_unreachable()
        return self._off_changes.take(off)
