"""A real ``vllm serve`` reloads its weights in place: no stale encoder output, ever.

``weights`` serves the model whose outputs the writer stored on disk D; its
vision-tower weights are then replaced through vLLM's own endpoints, as an RL
trainer's weight sync does (``collective_rpc`` ``reload_weights``, then
``reset_encoder_cache`` and ``reset_prefix_cache``). The same image must then
be encoded again under the new weights — a different answer — while ``disk``,
still on the old weights and the same directory, keeps loading the old one.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from .conftest import WEIGHT_IMAGES, ask, counters, settled_counters

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _post(server, path: str, body: dict | None = None) -> None:
    request = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.status == 200, response.read()


def test_weight_reload_re_encodes_and_other_instances_keep_their_weights(fleet):
    server = fleet.servers["weights"]
    image = WEIGHT_IMAGES[0]
    reference = fleet.reference[image]  # the writer's answer, old weights

    before = counters(server)
    old = ask(server, image)
    change = settled_counters(server, before, 1)
    assert (change["loads"], change["saves"]) == (1, 0), change  # stored: loaded
    assert old.logprobs == reference.logprobs

    _post(
        server,
        "/collective_rpc",
        {
            "method": "reload_weights",
            "kwargs": {"weights_path": str(fleet.model_w2)},
        },
    )
    _post(server, "/reset_encoder_cache")
    _post(server, "/reset_prefix_cache")

    before = counters(server)
    new = ask(server, image)
    change = settled_counters(server, before, 1)
    assert (change["loads"], change["saves"]) == (0, 1), change  # encoded again, saved
    assert new.logprobs != old.logprobs  # the vision weights matter

    disk = fleet.servers["disk"]  # same directory, still the old weights
    before = counters(disk)
    again = ask(disk, image)
    change = settled_counters(disk, before, 1)
    assert (change["loads"], change["saves"]) == (1, 0), change
    assert again.logprobs == reference.logprobs
    assert again.top_logprobs == reference.top_logprobs
