"""The vLLM scheduler side never promises a load that no worker has staged.

``has_cache_item`` is vLLM asking "will this item be loaded instead of
encoded?". On a consumer the answer is yes only for items already staged in
worker memory on every rank; the tiers holding the item is not enough (the
load would then read a tier inside the model step, or fail there). Uses the
vLLM fixtures of ``tests/vllm`` (real scheduler connector, tiny model).
"""

from __future__ import annotations

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

from tests.vllm.harness import Engine, image_hash, lone_request, make_vllm_config


def test_consumer_promises_only_staged_items(model_config, extra):
    image = image_hash("stored-not-staged.png")
    # No workers announce a weights fingerprint to this lone scheduler side.
    extra = {**extra, "weights_fingerprint": False}
    producer = Engine(make_vllm_config(model_config, "ec_both", extra))
    try:
        producer.run_until_finished([producer.add_request([image])])
        producer.flush()
    finally:
        producer.shutdown()

    config = make_vllm_config(model_config, "ec_consumer", extra)
    connector = ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER)
    try:
        assert connector.scheduler.index.lookup(image) == "disk"  # the tiers hold it ...
        assert not connector.has_cache_item(image)  # ... but no worker has staged it
        # Asked to make it available, the scheduler orders a prefetch and defers:
        # still not a promise until the workers report it staged.
        assert not connector.ensure_cache_available(lone_request(image), 0)
        assert not connector.has_cache_item(image)
    finally:
        connector.shutdown()
