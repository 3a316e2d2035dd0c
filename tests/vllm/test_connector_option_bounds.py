"""``ec_connector_extra_config`` numbers are bounded as the ``ec:`` section's are: a
value the connector could not use stops start-up with a ``ConfigError`` naming
``ec_connector_extra_config.<key>`` (docs/vllm.md), never a traceback at start
nor a scheduler step that crashes later.

- every time (``*_s``) is at most one day (``config_schema.MAX_SECONDS``): a wait
  of ~2.2e6 s overflowed the scheduler's selector at the first hit, and a huge
  ``claim_wait_s`` made claims never expire; a wait of one day still serves;
- a number past a float's range is refused naming the key (it raised
  OverflowError), and ``max_staged_mb`` is at most the ``ec:`` section's
  largest size (its bytes would overflow at the worker's start);
- a count (``max_pending_saves``, ``max_inflight_items``) is a whole number: 2.7
  is refused, not cut to 2.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from lmcache_ec.config import ConfigError
from lmcache_ec.config_schema import MAX_SECONDS
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings

from .harness import Engine, image_hash, make_vllm_config

SECONDS = [f.name for f in fields(ConnectorSettings) if f.name.endswith("_s")]
COUNTS = [f.name for f in fields(ConnectorSettings) if type(f.default) is int]
NUMBERS = [f.name for f in fields(ConnectorSettings) if type(f.default) in (int, float)]


def test_the_times_and_counts_are_the_ones_documented():
    assert {"idle_stage_wait_s", "busy_stage_wait_s", "claim_wait_s"} <= set(SECONDS)
    assert COUNTS == ["max_pending_saves", "max_inflight_items"]


@pytest.mark.parametrize("value", [MAX_SECONDS + 1, 3e6, 1e300])
@pytest.mark.parametrize("name", SECONDS)
def test_a_time_past_one_day_is_refused_naming_the_key(name, value):
    with pytest.raises(ConfigError, match=f"ec_connector_extra_config.{name}: must be at most"):
        ConnectorSettings.from_extra_config({name: value})


@pytest.mark.parametrize("name", SECONDS)
def test_a_time_of_one_day_is_taken(name):
    settings = ConnectorSettings.from_extra_config({name: MAX_SECONDS})
    assert getattr(settings, name) == MAX_SECONDS


@pytest.mark.parametrize("name", NUMBERS)
def test_a_number_past_a_floats_range_is_refused_or_taken_never_a_traceback(name):
    big = 10**400  # math.isfinite of it overflows
    if name in COUNTS:  # a count needs no float: taken as written
        assert getattr(ConnectorSettings.from_extra_config({name: big}), name) == big
        return
    with pytest.raises(ConfigError, match=f"ec_connector_extra_config.{name}: expected a number"):
        ConnectorSettings.from_extra_config({name: big})


def test_a_staged_bound_past_the_largest_size_is_refused():
    with pytest.raises(ConfigError, match=r"ec_connector_extra_config\.max_staged_mb: must be"):
        ConnectorSettings.from_extra_config({"max_staged_mb": 1e308})  # bytes: inf


@pytest.mark.parametrize("name", COUNTS)
def test_a_count_that_is_no_whole_number_is_refused_not_cut(name):
    with pytest.raises(ConfigError, match=f"{name}: expected a whole number, got 2.7"):
        ConnectorSettings.from_extra_config({name: 2.7})
    taken = getattr(ConnectorSettings.from_extra_config({name: 2.0}), name)
    assert (taken, type(taken)) == (2, int)


def test_an_engine_given_a_wait_past_a_day_stops_at_start_naming_it(model_config, extra):
    config = make_vllm_config(model_config, "ec_both", {**extra, "idle_stage_wait_s": 3e6})
    with pytest.raises(ConfigError, match=r"ec_connector_extra_config\.idle_stage_wait_s"):
        Engine(config).shutdown()


def test_an_engine_waiting_up_to_a_day_serves_a_hit(model_config, extra):
    """The longest wait taken never overflows the scheduler's selector (which
    raised OverflowError past ~2.2e6 s on the first hit)."""
    image = image_hash("one-day.png")
    first = Engine(make_vllm_config(model_config, "ec_both", extra))
    try:
        first.run_until_finished([first.add_request([image])])
        first.flush()
    finally:
        first.shutdown()
    waiting = {**extra, "idle_stage_wait_s": MAX_SECONDS}
    second = Engine(make_vllm_config(model_config, "ec_both", waiting))
    try:
        second.run_until_finished([second.add_request([image])])
        assert second.encoded == []  # loaded, not encoded: the wait ended with the load
    finally:
        second.shutdown()
