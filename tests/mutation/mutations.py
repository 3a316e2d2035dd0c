"""The planted bugs: one entry per guarantee the product makes, and the tests that catch it.

Each ``Mutation`` replaces the exact text ``find`` (which must occur exactly
once in ``path``) by ``replace`` and expects every test in ``tests`` to fail.
Adding a guarantee is one entry here (see docs/testing.md). Keep ``find``
short and stable: when the code it names changes, the runner reports
"snippet not found" and the check fails until the entry is updated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    guarantee: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]


KEY = "lmcache_ec/key.py"
CODEC = "lmcache_ec/codec.py"
T_KEY = "tests/test_key.py"
T_ENGINE = "tests/test_engine.py"
T_CODEC = "tests/test_codec.py"
T_DISK = "tests/test_disk_tier.py"
T_CORRUPTION = "tests/faults/test_corruption.py"
T_OUTAGES = "tests/faults/test_remote_outages.py"
CHANNEL = "lmcache_ec/integration/vllm/channel.py"
STAGE_FRAMES = "lmcache_ec/integration/vllm/stage_frames.py"
T_CHANNEL = "tests/chaos/test_stage_channel_faults.py"


def _digest_field(field: str, follows: str, extra: tuple[str, ...] = ()) -> Mutation:
    """``field`` dropped from the tuple hashed into the key's SHA-256 (``follows``:
    the line after it there, so that the snippet is unique)."""
    return Mutation(
        f"digest-without-{field}",
        f"{field} is part of the key digest",
        KEY,
        f"            self.{field},\n{follows}",
        follows,
        (f"{T_KEY}::test_every_identity_field_is_in_the_digest[{field}]", *extra),
    )


MUTATIONS: list[Mutation] = [
    # -- identity: every field in the digest (the name's slugs are not unique)
    _digest_field(
        "namespace",
        "            self.model,",
        (f"{T_ENGINE}::test_tenants_with_colliding_slugs_never_exchange_entries",),
    ),
    _digest_field("model", "            self.revision,"),
    _digest_field(
        "revision",
        "            self.fingerprint,",
        (f"{T_ENGINE}::test_identities_never_exchange_entries",),
    ),
    _digest_field(
        "fingerprint",
        "            self.dtype,",
        (f"{T_ENGINE}::test_identities_never_exchange_entries",),
    ),
    _digest_field("dtype", "        ):"),
    Mutation(
        "digest-without-weights",
        "the encoder weights version is part of the key digest",
        KEY,
        "            _feed(hasher, self.weights)\n",
        "            pass\n",
        (
            f"{T_KEY}::test_every_identity_field_is_in_the_digest[weights]",
            f"{T_KEY}::test_weights_version_changes_the_digest_and_unset_keeps_old_digests",
        ),
    ),
    Mutation(
        "digest-without-mm-hash",
        "mm_hash is part of the key digest",
        KEY,
        "        _feed(hasher, mm_hash)\n",
        "",
        (
            f"{T_KEY}::test_mm_hash_is_in_the_digest",
            f"{T_ENGINE}::test_put_many_and_get_many",
        ),
    ),
    # -- checksums on every read path
    Mutation(
        "disk-read-skips-payload-checksum",
        "disk reads (read_frame + decode_read) verify the payload checksum",
        CODEC,
        "if (xxhash.xxh3_64_intdigest(data) if taken is None else taken) != payload_sum:",
        "if False:",
        (
            f"{T_CODEC}::test_disk_read_path_checks_the_payload[piece-boundary-shape1]",
            f"{T_CORRUPTION}::test_damaged_file_is_a_miss_and_is_removed[flip-payload]",
        ),
    ),
    Mutation(
        "remote-read-skips-payload-checksum",
        "remote reads (decode_bytes) verify the payload checksum",
        CODEC,
        "_verify(raw, key, True)",
        "_verify(raw, key, False)",
        (
            f"{T_CODEC}::test_remote_read_path_checks_the_payload",
            f"{T_CORRUPTION}::test_damaged_remote_entry_is_a_miss_and_is_removed[redis-flip-payload]",
        ),
    ),
    Mutation(
        "frame-decoder-skips-payload-checksum",
        "frames read into memory (decode_payload) verify the payload checksum",
        CODEC,
        "    if xxhash.xxh3_64_intdigest(data) != payload_sum:",
        "    if False:",
        (f"{T_CODEC}::test_flipped_byte_is_detected[-1-payload checksum]",),
    ),
    Mutation(
        "header-checksum-skipped",
        "disk and remote reads verify the header checksum",
        CODEC,
        # The read path's one check (the header is parsed without a second).
        "    if xxhash.xxh3_64_intdigest(raw) != header_sum:\n"
        '        raise CorruptEntryError("header checksum mismatch")\n'
        "    data = raw.tobytes()\n",
        "    data = raw.tobytes()\n",
        (
            f"{T_CODEC}::test_flipped_byte_is_detected[70-header checksum]",
            f"{T_CODEC}::test_disk_read_path_checks_the_header_and_the_key",
        ),
    ),
    # -- corrupt entries are removed, not only skipped
    Mutation(
        "corrupt-entry-kept",
        "an entry that fails verification is removed from every tier",
        "lmcache_ec/reads.py",
        "        self.remove_everywhere(key)\n        raise _Dropped from None",
        "        raise _Dropped from None",
        (
            "tests/test_reads.py::test_truncated_disk_entry_is_a_counted_miss_and_removed",
            f"{T_CORRUPTION}::test_damaged_file_is_a_miss_and_is_removed[flip-payload]",
            f"{T_CORRUPTION}::test_damaged_remote_entry_is_a_miss_and_is_removed[redis-flip-payload]",
        ),
    ),
    # -- atomic disk writes
    Mutation(
        "disk-write-in-place",
        "disk writes go to a temporary name, published when whole",
        "lmcache_ec/tiers/disk_layout.py",
        "        temp = temp or self.temp_path(name)\n",
        "        temp = self.path_of(name)\n",
        ("tests/faults/test_concurrency.py::test_writer_killed_mid_write_leaves_no_torn_entry",),
    ),
    # -- remote calls are bounded by remote_timeout
    Mutation(
        "redis-unbounded-socket-timeout",
        "Redis calls are bounded by remote_timeout",
        "lmcache_ec/remote/redis_store.py",
        '"socket_timeout": timeout,',
        '"socket_timeout": None,',
        (f"{T_OUTAGES}::test_silent_server_calls_return_within_the_timeout[redis]",),
    ),
    Mutation(
        "s3-long-read-timeout",
        "S3 calls are bounded by remote_timeout",
        "lmcache_ec/remote/s3_store.py",
        "read_timeout=settings.timeout,",
        "read_timeout=60,",
        (f"{T_OUTAGES}::test_silent_server_calls_return_within_the_timeout[s3]",),
    ),
    # -- LRU on each tier: hits refresh recency
    Mutation(
        "cpu-tier-fifo",
        "CPU tier hits refresh LRU order",
        "lmcache_ec/tiers/local_cpu.py",
        "                self.hot_cache.move_to_end(key)\n",
        "                pass\n",
        (f"{T_ENGINE}::test_cpu_tier_evicts_least_recently_used",),
    ),
    Mutation(
        "disk-tier-fifo",
        "disk tier hits refresh LRU order",
        "lmcache_ec/tiers/frame_directory.py",
        "        self.layout.touch(entry)\n",
        "        pass\n",
        (
            f"{T_DISK}::test_disk_capacity_evicts_least_recently_used",
            f"{T_DISK}::test_lru_order_survives_restart",
        ),
    ),
    # -- input validation
    Mutation(
        "tensor-rank-unchecked",
        "only dense non-empty 2-D tensors of a supported dtype are stored",
        "lmcache_ec/engine.py",
        "    if tensor.dim() != 2:\n",
        "    if False:\n",
        (
            f"{T_ENGINE}::test_bad_tensors_raise_clear_errors_and_store_nothing[value2-ValueError-2-D]",
            f"{T_ENGINE}::test_bad_tensors_raise_clear_errors_and_store_nothing[value3-ValueError-2-D]",
        ),
    ),
    Mutation(
        "pinned-dtype-unchecked",
        "an identity that pins a dtype refuses tensors of another dtype",
        "lmcache_ec/engine.py",
        "    if pinned_dtype and name != pinned_dtype:\n",
        "    if False:\n",
        (f"{T_ENGINE}::test_pinned_dtype_rejects_other_dtypes",),
    ),
    # -- vLLM connector
    Mutation(
        "non-content-ids-persisted",
        "identifiers that are not content hashes are never stored (by default)",
        "lmcache_ec/integration/vllm/identity.py",
        "    return bool(_CONTENT_ID.match(identifier))",
        "    return True",
        (
            "tests/vllm/test_identity_plugin_stats.py::test_identifier_policy",
            "tests/vllm/test_identity_plugin_stats.py::"
            "test_request_scoped_ids_are_not_persisted_unless_allowed",
        ),
    ),
    Mutation(
        "scheduler-promises-unstaged-load",
        "a consumer's scheduler promises a load only for items staged on every rank",
        "lmcache_ec/integration/vllm/scheduler.py",
        "hit = item is not None and item.state in (S.READY, S.PROMISED)",
        "hit = self.index.lookup(identifier) not in (None, PENDING)",
        # vLLM's own flow asks has_cache_item only once ensure_cache_available has
        # waited for staging (tests/vllm/test_prefetch.py), so ask it directly.
        ("tests/test_scheduler_promise.py::test_consumer_promises_only_staged_items",),
    ),
    # -- weights: nothing staged under old weights is loaded after an update
    Mutation(
        "weight-update-keeps-stagings",
        "a weight update gives up every prefetch made for the old weights",
        "lmcache_ec/integration/vllm/scheduler.py",
        "doomed = self.items.having(*_FETCHING)",
        "doomed: list[str] = []",
        ("tests/vllm/test_weights.py::test_staged_items_never_cross_an_update",),
    ),
    Mutation(
        "weights-not-fingerprinted",
        "the encoder weights' content is in the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        "hasher.update(xxhash.xxh3_128_digest(",
        "(xxhash.xxh3_128_digest(",
        (
            "tests/vllm/test_weights.py::test_fingerprint_sees_the_encoder_only",
            "tests/vllm/test_weights.py::test_the_weights_matter",
        ),
    ),
    # -- an upload sends the pool buffer in place: it must hold it until sent
    Mutation(
        "upload-without-its-own-reference",
        "a queued upload holds its frame's pool buffer until the bytes are sent",
        "lmcache_ec/remote/backend.py",
        "payload = self.serializer.serialize(memory_obj)  # our own reference",
        "payload = memory_obj",
        (
            "tests/remote/test_sharing.py::"
            "test_upload_sends_the_staged_frame_in_place_without_waking_the_event_loop[redis]",
        ),
    ),
    # -- Model Runner V1: a lone request on an idle engine loads, never re-encodes
    Mutation(
        "stage-orders-only-in-step-metadata",
        "stage orders reach the workers in steps V1 skips (the stage channel)",
        "lmcache_ec/integration/vllm/scheduler.py",
        'direct = self._channel_ready() and self.channel.send(dispatched, self.weights or "")',
        "direct = False",
        (
            "tests/vllm/test_stage_channel.py::test_lone_requests_load_from_disk_on_v1",
            "tests/vllm/test_stage_channel.py::test_lone_requests_load_from_redis_on_v1[ec_consumer]",
        ),
    ),
    # -- the stage channel never stalls a step and never trusts a peer
    Mutation(
        "stage-link-blocking-send",
        "a worker's sends to the scheduler never wait on the peer",
        CHANNEL,
        "            sock.setblocking(False)\n            link = StageLink(sock, self)",
        "            sock.setblocking(True)\n            link = StageLink(sock, self)",
        (
            f"{T_CHANNEL}::test_a_peer_that_never_reads_never_blocks_a_step_or_a_new_scheduler",
            f"{T_CHANNEL}::test_a_report_larger_than_the_socket_buffer_never_waits_for_the_scheduler",
        ),
    ),
    Mutation(
        "stage-outbox-unbounded",
        "a link whose peer stops reading is dropped once its outbox is full",
        STAGE_FRAMES,
        "        if self.bytes + len(frame) > self.limit:",
        "        if False:",
        (
            f"{T_CHANNEL}::test_a_peer_that_never_reads_never_blocks_a_step_or_a_new_scheduler",
            f"{T_CHANNEL}::test_orders_never_block_on_a_worker_that_does_not_read",
        ),
    ),
    Mutation(
        "stage-client-blocking-socket",
        "the scheduler's reads and orders never wait on a worker",
        "lmcache_ec/integration/vllm/stage_client.py",
        "sock.setblocking(False)  # a full backlog fails (EAGAIN), never waits",
        "sock.setblocking(True)",
        (
            f"{T_CHANNEL}::test_a_partial_frame_never_blocks_the_scheduler",
            f"{T_CHANNEL}::test_orders_never_block_on_a_worker_that_does_not_read",
        ),
    ),
    Mutation(
        "stage-frame-size-unchecked",
        "a frame announced over the size limit is refused on sight",
        STAGE_FRAMES,
        "            if size > FRAME_MAX_BYTES:",
        "            if False:",
        (
            f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[2^62-length-header]",
            f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[over-the-size-limit]",
            f"{T_CHANNEL}::test_a_bad_frame_from_a_worker_breaks_the_channel_not_the_step[2^62-length-header]",
        ),
    ),
    Mutation(
        "stage-bad-frame-keeps-its-link",
        "a bad frame closes the link it came on",
        CHANNEL,
        "        except BadFrame as exc:\n"
        "            self._bad_frame(link, exc)\n"
        "            return",
        "        except BadFrame:\n            return",
        (
            f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[not-an-object]",
            f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[wrong-types]",
        ),
    ),
    Mutation(
        "stage-bad-frame-closes-every-link",
        "a bad frame closes only the link it came on",
        CHANNEL,
        '        if self._drop(link, "channel_bad_frames"):',
        "        for link in list(self._links.values()):\n"
        "            self._drop(link)\n"
        "        if True:",
        (f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[not-an-object]",),
    ),
    Mutation(
        "stage-bad-frame-escapes-receive",
        "a bad frame from a worker never raises out of the scheduler's step",
        "lmcache_ec/integration/vllm/stage_client.py",
        '                    self._break("bad frame", str(exc))\n'
        "                    return messages",
        "                    raise",
        (
            f"{T_CHANNEL}::test_a_bad_frame_from_a_worker_breaks_the_channel_not_the_step[400-digit-int-in-a-report]",
            f"{T_CHANNEL}::test_a_bad_frame_from_a_worker_breaks_the_channel_not_the_step[deep-nesting]",
        ),
    ),
    Mutation(
        "stage-counters-accept-huge-numbers",
        "a worker report's counters are finite numbers of sane size",
        "lmcache_ec/integration/vllm/stage_messages.py",
        "            and abs(number) < MAX_NUMBER\n",
        "",
        (
            f"{T_CHANNEL}::test_a_bad_frame_from_a_worker_breaks_the_channel_not_the_step[huge-counter]",
        ),
    ),
    Mutation(
        "stage-partial-frame-waits-forever",
        "a worker closes a link whose frame stays partial past its deadline",
        CHANNEL,
        "            if link.reader.overdue(now):",
        "            if False:",
        (f"{T_CHANNEL}::test_a_partial_frame_never_stops_the_worker_serving",),
    ),
    Mutation(
        "stage-links-unbounded",
        "a worker serves a bounded number of links and refuses more",
        CHANNEL,
        "                full = len(self._links) >= self.limits.max_links",
        "                full = False",
        (f"{T_CHANNEL}::test_connections_are_bounded_and_closed_links_forgotten",),
    ),
    Mutation(
        "stage-closed-links-kept",
        "a closed link is forgotten at once (not counted as a connected scheduler)",
        CHANNEL,
        "                del self._links[link.fd]\n",
        "",
        (
            f"{T_CHANNEL}::test_connections_are_bounded_and_closed_links_forgotten",
            f"{T_CHANNEL}::test_a_bad_frame_closes_only_its_link_on_the_worker[not-json]",
        ),
    ),
    Mutation(
        "stage-accept-gives-up-on-error",
        "a failed accept (out of descriptors) pauses accepting, never ends it",
        CHANNEL,
        "                self._backoff = min(1.0, 2 * self._backoff)\n                return",
        "                raise SystemExit",
        (f"{T_CHANNEL}::test_accept_survives_running_out_of_file_descriptors",),
    ),
    Mutation(
        "stage-socket-path-without-engine-id",
        "each engine's stage sockets are named by its engine id",
        CHANNEL,
        'f"{safe}-dp{dp_rank}-tp{tp_rank}.sock"',
        'f"engine-dp{dp_rank}-tp{tp_rank}.sock"',
        (
            "tests/vllm/test_stage_channel.py::test_two_engines_on_one_host_each_get_only_their_own_orders",
        ),
    ),
]

# Applied before the list: a deliberately broken copy. If these tests pass, the
# test run did not import the copy and nothing else the runner reports means anything.
CANARY = Mutation(
    "canary",
    "the test run imports the mutated copy",
    KEY,
    "KEY_FORMAT_VERSION = 1\n",
    'KEY_FORMAT_VERSION = 1\nraise RuntimeError("mutation canary")\n',
    (f"{T_KEY}::test_storage_name_is_deterministic",),
)
