"""Messages between the scheduler-side and worker-side connectors.

Scheduler → workers, once per step (``ECTierConnectorMetadata``):
  ``stage``    items to fetch from the tiers into worker memory, in the background;
  ``stage_rows``  per item staged, the rows its request expects (another length is refused);
  ``stage_order``  that order's number (the scheduler's count of such orders);
  ``loads``    staged items to place into vLLM's encoder cache before the encoder runs;
  ``release``  staged items no longer wanted (expired, failed on another rank).

Workers → scheduler, once per step (``ECTierWorkerMetadata``, aggregated over
ranks by vLLM before ``update_connector_output``; over the stage channel
instead, one ``WorkerReport`` per rank, when it is connected):
  ``saved``    items this worker stored (the scheduler may now offer them);
  ``staged``   per item, how many ranks hold it staged (summed over ranks);
  ``failed``   items some rank could not stage (the encoder runs instead);
  ``orders``   per item staged or failed, the ``stage_order`` it answers (-1 if
               ranks answered different ones in one step: the scheduler takes
               neither, and the item waits out its deadline);
  ``stats``    counter deltas since the last report (summed over ranks);
  ``weights``  the weights version ``saved`` items were keyed under (None if
               unknown or if ranks disagree mid-update: then ``saved`` is ignored).

Plain sets, dicts and numbers: vLLM serializes these between processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorMetadata,
    ECConnectorWorkerMetadata,
)

from .stage_messages import WorkerReport


@dataclass
class ECTierConnectorMetadata(ECConnectorMetadata):
    stage: list[str] = field(default_factory=list)
    stage_rows: dict[str, int] = field(default_factory=dict)
    loads: dict[str, int] = field(default_factory=dict)  # identifier -> num embeds
    release: list[str] = field(default_factory=list)
    stage_order: int = 0


@dataclass
class ECTierWorkerMetadata(ECConnectorWorkerMetadata):
    saved: set[str] = field(default_factory=set)
    staged: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    stats: dict[str, float] = field(default_factory=dict)
    weights: str | None = None
    orders: dict[str, int] = field(default_factory=dict)

    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECTierWorkerMetadata:
        assert isinstance(other, ECTierWorkerMetadata)
        staged = dict(self.staged)
        for identifier, ranks in other.staged.items():
            staged[identifier] = staged.get(identifier, 0) + ranks
        stats = dict(self.stats)
        for name, value in other.stats.items():
            stats[name] = stats.get(name, 0) + value
        orders = dict(self.orders)
        for identifier, order in other.orders.items():
            orders[identifier] = order if orders.get(identifier, order) == order else -1
        return ECTierWorkerMetadata(
            saved=self.saved | other.saved,
            staged=staged,
            failed=self.failed | other.failed,
            stats=stats,
            weights=self.weights if self.weights == other.weights else None,
            orders=orders,
        )

    def is_empty(self) -> bool:
        return not (self.saved or self.staged or self.failed or self.stats)

    def to_report(self) -> WorkerReport:
        """This report as a stage-channel message (one rank's: staged counts are 1)."""
        return WorkerReport(
            saved=tuple(sorted(self.saved)),
            staged=tuple(sorted(self.staged)),
            failed=tuple(sorted(self.failed)),
            stats=dict(self.stats),
            weights=self.weights,
            orders=dict(self.orders),
        )

    @classmethod
    def from_report(cls, report: WorkerReport) -> ECTierWorkerMetadata:
        return cls(
            saved=set(report.saved),
            staged=dict.fromkeys(report.staged, 1),
            failed=set(report.failed),
            stats=dict(report.stats),
            weights=report.weights,
            orders=dict(report.orders),
        )
