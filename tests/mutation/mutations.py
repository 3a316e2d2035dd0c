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
T_DISK = "tests/tiers/test_disk_tier.py"
T_CORRUPTION = "tests/faults/test_corruption.py"
T_OUTAGES = "tests/faults/test_remote_outages.py"
SCHEDULER = "lmcache_ec/integration/vllm/scheduler.py"
DECISIONS = "lmcache_ec/integration/vllm/item_decisions.py"
WORKER_LINK = "lmcache_ec/integration/vllm/worker_link.py"
KNOWN_WEIGHTS = "lmcache_ec/integration/vllm/known_weights.py"
RUNTIME_DIRS = "lmcache_ec/runtime_dirs.py"
T_LIFECYCLE = "tests/vllm/test_item_lifecycle.py"
T_LEDGER_RACES = "tests/tiers/test_ledger_races.py"
T_PURGE_FAILURES = "tests/purge/test_purge_failures.py"
T_CLUSTER_BUILD = "tests/cluster/test_cluster_client_build.py"
_GIVE_BACK_RACING = "test_a_reservation_given_back_racing_another_process_scan_never_under_counts"
ITEMS = "lmcache_ec/integration/vllm/items.py"
T_ITEMS = "tests/vllm/test_items.py"
T_RESET = "tests/vllm/test_encoder_cache_reset.py"
T_RUNTIME_DIRS = "tests/chaos/test_runtime_dirs.py"
T_NO_CHANNEL = "tests/chaos/test_fingerprint_without_channel.py"
T_FULL = "tests/chaos/test_node_full.py::"
T_WEIGHTS = "tests/vllm/test_weights.py::"
T_IDENTITY = "tests/vllm/test_identity_plugin_stats.py::"
T_CLAIMS = "tests/remote/test_claims.py::"
CHANNEL = "lmcache_ec/integration/vllm/channel.py"
STAGE_FRAMES = "lmcache_ec/integration/vllm/stage_frames.py"
T_CHANNEL = "tests/chaos/test_stage_channel_faults.py"
CONFIG = "lmcache_ec/config.py"
CONFIG_SCHEMA = "lmcache_ec/config_schema.py"
T_TYPED = "tests/test_config_typed.py"
ENGINE = "lmcache_ec/engine.py"
SINGLE_FLIGHT = "lmcache_ec/storage/single_flight.py"
GET_OR_COMPUTE = "lmcache_ec/storage/get_or_compute.py"
T_GET_OR_COMPUTE = "tests/test_get_or_compute.py"
T_REMOTE_GET_OR_COMPUTE = "tests/remote/test_get_or_compute.py"


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
        "_verify(raw, key, True, exact=True)",
        "_verify(raw, key, False, exact=True)",
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
        "lmcache_ec/storage/reads.py",
        "        self.remove_everywhere(key, damaged_in=tier)\n        raise _Dropped from None",
        "        raise _Dropped from None",
        (
            "tests/storage/test_reads.py::test_truncated_disk_entry_is_a_counted_miss_and_removed",
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
        "s3-long-read-timeout",
        "S3 calls end within remote_timeout, an abandoned one included (its thread comes back)",
        "lmcache_ec/remote/s3_store.py",
        "read_timeout=settings.timeout,",
        "read_timeout=60,",
        (
            "tests/remote/test_dripping_servers.py::"
            "test_an_abandoned_s3_call_frees_its_thread_within_the_timeout",
        ),
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
    # -- node tier: reads copy out, check the stored size
    Mutation(
        "node-read-maps-the-file",
        "a node-tier read hands out no memory mapped from the shared file",
        "lmcache_ec/tiers/frame_directory.py",
        "            read = read_frame(fd, os.fstat(fd).st_size)\n",
        "            read = FrameRead(__import__('numpy').frombuffer(__import__('mmap').mmap(\n"
        "                fd, os.fstat(fd).st_size, flags=__import__('mmap').MAP_PRIVATE),\n"
        "                dtype='uint8'))\n",
        (
            "tests/chaos/test_node_truncation.py::test_the_reader_survives_every_truncation",
            "tests/chaos/test_node_truncation.py::"
            "test_a_result_stays_valid_after_its_entry_is_truncated",
            "tests/tiers/test_node_tier.py::test_reads_are_private_copies",
        ),
    ),
    Mutation(
        "tier-damaged-entry-kept",
        "an entry a tier reports damaged is removed like one that fails decoding",
        "lmcache_ec/storage/reads.py",
        "        except codec.CorruptEntryError as exc:  # the tier found the entry damaged\n"
        "            self._drop(key, tier, exc)\n",
        "",
        (
            "tests/tiers/test_node_tier.py::"
            "test_padded_entry_is_a_miss_removed_without_reading_its_padding",
        ),
    ),
    # -- node tier: a full filesystem, failed writes, cleanup
    Mutation(
        "node-tier-ignores-free-space",
        "the node tier's limit is also capped by its filesystem's free space",
        "lmcache_ec/tiers/node.py",
        "    capped_by_free_space = True",
        "    capped_by_free_space = False",
        (f"{T_FULL}test_puts_beyond_the_filesystem_evict_and_keep_writing",),
    ),
    Mutation(
        "full-write-not-retried",
        "a node-tier write that finds its filesystem full evicts and retries once",
        "lmcache_ec/tiers/frame_directory.py",
        "if exc.errno != errno.ENOSPC or not self.budget.capped_by_free_space:",
        "if True:",
        (f"{T_FULL}test_a_write_that_finds_the_filesystem_full_evicts_and_retries_once",),
    ),
    Mutation(
        "failed-node-write-reported-stored",
        "put returns False when the node tier could not write the entry",
        "lmcache_ec/engine.py",
        "if node is not None and not node.holds(key):",
        "if False:",
        (f"{T_FULL}test_a_filesystem_filled_by_others_fails_puts_until_it_has_room",),
    ),
    Mutation(
        "node-tier-never-cleared",
        "the last process to leave the node tier removes its entries",
        "lmcache_ec/tiers/node.py",
        "            return self._clear() if self._alone() else 0",
        "            return 0",
        (
            "tests/tiers/test_node_tier.py::test_the_last_user_to_leave_clears_the_node_tier",
            "tests/tiers/test_node_tier.py::test_four_ranks_hold_each_image_once",
        ),
    ),
    Mutation(
        "node-leftovers-kept",
        "entries no process uses are removed by the next process to use the node tier",
        "lmcache_ec/tiers/node.py",
        "            self.cleared_at_start = self._clear() if self._alone() else 0",
        "            self.cleared_at_start = 0 if self._alone() else 0",
        ("tests/tiers/test_node_tier.py::test_entries_nobody_uses_are_removed_by_the_next_user",),
    ),
    Mutation(
        "node-users-not-counted",
        "node-tier entries stay while any process on the node uses them",
        "lmcache_ec/tiers/node.py",
        "            flock_within(self._fd, USERS_LOCK_WAIT_S, self._path, shared=True)",
        "            fcntl.flock(self._fd, fcntl.LOCK_UN)",
        ("tests/tiers/test_node_tier.py::test_the_last_user_to_leave_clears_the_node_tier",),
    ),
    # -- input validation
    Mutation(
        "tensor-rank-unchecked",
        "only dense non-empty 2-D tensors of a supported dtype are stored",
        "lmcache_ec/codec.py",
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
        "lmcache_ec/codec.py",
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
        "hit = state in (S.READY, S.PROMISED)",
        "hit = self.index.lookup(identifier) not in (None, PENDING)",
        # vLLM's own flow asks has_cache_item only once ensure_cache_available has
        # waited for staging (tests/vllm/test_prefetch.py), so ask it directly.
        ("tests/vllm/test_scheduler_promise.py::test_consumer_promises_only_staged_items",),
    ),
    Mutation(
        "idle-step-give-up-backs-off",
        "an order an idle step dropped holds its image off the tiers for no failed_retry_s",
        SCHEDULER,
        "self.items.move(identifier, S.UNKNOWN)\n        self.prefetch.done",
        "self.fail(identifier, now)\n        self.prefetch.done",
        (
            "tests/vllm/test_stage_channel.py::"
            "test_an_idle_step_give_up_does_not_hold_the_image_off_a_busy_engine",
        ),
    ),
    Mutation(
        "order-after-idle-step-given-up",
        "an order made after an idle step rides the next step, not given up for the idle one",
        DECISIONS,
        "            if identifier in self.held_back:\n",
        "            if not item.direct and self.held_back is not None:\n",
        (
            "tests/vllm/test_stage_channel.py::"
            "test_an_order_made_after_an_idle_step_waits_for_its_own_step",
        ),
    ),
    # -- weights: nothing staged under old weights is loaded after an update
    Mutation(
        "weight-update-keeps-stagings",
        "a weight update gives up every prefetch made for the old weights",
        "lmcache_ec/integration/vllm/scheduler.py",
        "doomed = self.items.having(*FETCHING)",
        "doomed: list[str] = []",
        (
            "tests/vllm/test_weights.py::test_staged_items_never_cross_an_update",
            (
                "tests/vllm/test_weight_seams.py::test_an_item_staged_before_a_weight_transf"
                "er_is_encoded_after_it"
            ),
        ),
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
    Mutation(
        "device-fingerprint-cancels",
        "structured changes of device-resident weights change the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        # Position weights 1..65521, as the sums this replaced had.
        "table = _splitmix64(np.arange(MIX_CHUNK, dtype=np.uint64)) | np.uint64(1)",
        "table = np.arange(MIX_CHUNK, dtype=np.uint64) % np.uint64(65521) + np.uint64(1)",
        (
            f"{T_WEIGHTS}test_mixed_sum_sees_a_plus_one_minus_two_plus_one_on_neighbours",
            f"{T_WEIGHTS}test_mixed_sum_sees_two_values_swapped_65521_apart",
        ),
    ),
    Mutation(
        "device-fingerprint-chunks-unkeyed",
        "whole chunks of a device tensor trading places change the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        "        total += (sums * keys[first:last]).sum()\n",
        "        total += sums.sum()\n",
        (f"{T_WEIGHTS}test_mixed_sum_sees_chunks_trade_places_and_single_changes",),
    ),
    Mutation(
        "encoder-buffers-not-fingerprinted",
        "the vision tower's buffers are part of the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        "    named += list(model.named_buffers(remove_duplicate=True))\n",
        "",
        (f"{T_WEIGHTS}test_vision_buffers_count_and_language_model_buffers_do_not",),
    ),
    Mutation(
        "language-model-buffers-fingerprinted",
        "the language model's buffers are not part of the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        "return {id(t) for t in language.parameters()} | {id(t) for t in language.buffers()}",
        "return {id(t) for t in language.parameters()}",
        (f"{T_WEIGHTS}test_vision_buffers_count_and_language_model_buffers_do_not",),
    ),
    Mutation(
        "weights-dtype-not-fingerprinted",
        "a weight's dtype is part of the fingerprint",
        "lmcache_ec/integration/vllm/weights.py",
        "{tuple(tensor.shape)}|{tensor.dtype}|{tensor.device.type}",
        "{tuple(tensor.shape)}|{tensor.device.type}",
        (
            f"{T_WEIGHTS}test_a_weight_reinterpreted_as_another_16_bit_dtype_changes_the_fingerprint",
        ),
    ),
    Mutation(
        "identity-without-processor-kwargs",
        "mm_processor_kwargs are part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        '    settings["mm_processor_kwargs"] = settings["mm_processor_kwargs"] or {}\n',
        '    settings["mm_processor_kwargs"] = {}\n',
        (f"{T_IDENTITY}test_processor_kwargs_alone_and_quantization_alone_change_the_identity",),
    ),
    Mutation(
        "identity-without-quantization",
        "the quantization method is part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        '"quantization": str(getattr(model_config, "quantization", None)),',
        '"quantization": "",',
        (f"{T_IDENTITY}test_processor_kwargs_alone_and_quantization_alone_change_the_identity",),
    ),
    # -- claims: only the owner releases; claiming again renews
    Mutation(
        "redis-release-deletes-any-claim",
        "a Redis claim is released only by its owner",
        "lmcache_ec/remote/redis_store.py",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return",
        "if true then return",
        (
            f"{T_CLAIMS}test_a_slow_holders_release_leaves_anothers_fresh_claim[redis]",
            "tests/cluster/test_cluster_claims.py::test_cluster_claims[0.001]",
        ),
    ),
    Mutation(
        "redis-claim-not-reentrant",
        "a Redis claim already held by the caller is renewed, not refused",
        "lmcache_ec/remote/redis_store.py",
        "if held and held ~= ARGV[1] then return 0 end",
        "if held then return 0 end",
        (
            f"{T_CLAIMS}test_the_holder_claiming_again_renews_its_claim[redis]",
            "tests/cluster/test_cluster_claims.py::test_cluster_claims[3600.0]",
        ),
    ),
    Mutation(
        "s3-release-deletes-any-claim",
        "an S3 claim is released only by its owner",
        "lmcache_ec/remote/s3_store.py",
        "        if held is None or held[0] != self.claim_owner:\n",
        "        if held is None:\n",
        (f"{T_CLAIMS}test_a_slow_holders_release_leaves_anothers_fresh_claim[s3]",),
    ),
    Mutation(
        "s3-release-unconditional-delete",
        "an S3 release deletes only the claim version it read (If-Match)",
        "lmcache_ec/remote/s3_store.py",
        "self._client.delete_object(IfMatch=held[2], **claim)",
        "self._client.delete_object(**claim)",
        (f"{T_CLAIMS}test_s3_release_racing_a_takeover_deletes_nothing",),
    ),
    Mutation(
        "s3-claim-not-reentrant",
        "an S3 claim already held by the caller is renewed, not refused",
        "lmcache_ec/remote/s3_store.py",
        "if owner != self.claim_owner and expires > time.time():",
        "if expires > time.time():",
        (f"{T_CLAIMS}test_the_holder_claiming_again_renews_its_claim[s3]",),
    ),
    Mutation(
        "directory-release-unchecked",
        "a directory claim taken over during its release is left alone",
        "lmcache_ec/claims.py",
        "                if held is not None and held[0] == self.owner:\n",
        "                if True:\n",
        ("tests/test_claims.py::test_a_slow_holders_release_leaves_a_takeover_alone",),
    ),
    Mutation(
        "directory-claim-not-renewed",
        "claiming a directory claim one holds renews it",
        "lmcache_ec/claims.py",
        "        return owner == self.owner or time.time() >= expires\n",
        "        return time.time() >= expires\n",
        ("tests/test_claims.py::test_claiming_again_renews",),
    ),
    Mutation(
        "directory-claim-lock-waits-forever",
        "a directory claim waits at most a bound for the directory's lock, then works anyway",
        "lmcache_ec/flocks.py",
        "            fcntl.flock(fd, mode | fcntl.LOCK_NB)\n",
        "            fcntl.flock(fd, mode)\n",
        ("tests/test_claims.py::test_a_lock_held_too_long_is_a_duplicate_not_a_wait",),
    ),
    Mutation(
        "ledger-lock-waits-forever",
        "an engine on a directory whose ledger another process keeps locked"
        " still starts and writes within a bound",
        "lmcache_ec/tiers/budget.py",
        '                    flock_within(fd, self.lock_wait_s, "disk size ledger")\n',
        "                    fcntl.flock(fd, fcntl.LOCK_EX)\n",
        (
            "tests/tiers/test_disk_budget.py::"
            "test_a_ledger_held_for_good_stops_neither_a_start_nor_a_write",
        ),
    ),
    Mutation(
        "directory-claim-lost-with-its-sweep",
        "a directory claim whose sweep cannot run (the lock held) is still made",
        "lmcache_ec/claims.py",
        '            logger.debug("Claims sweep of %s skipped (%s)", self.directory, exc)\n',
        "            raise\n",
        ("tests/test_claims.py::test_a_sweep_that_cannot_run_still_makes_the_claim",),
    ),
    Mutation(
        "directory-takeover-not-checked-again",
        "an expired directory claim is taken over only if it is still expired under the lock",
        "lmcache_ec/claims.py",
        "                if not self._ours_to_take(held):\n"
        "                    return False  # taken over meanwhile\n",
        "",
        ("tests/test_claims.py::test_a_takeover_racing_another_leaves_one_holder",),
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
        WORKER_LINK,
        (
            '            and self.channel.send(dispatched, self.weights or "", '
            "self.rows_of(dispatched))\n"
        ),
        "            and False\n",
        (
            "tests/vllm/test_stage_channel.py::test_lone_requests_load_from_disk_on_v1",
            (
                "tests/vllm/test_stage_channel.py::test_lone_requests_load_from_redis_on_v1["
                "ec_consumer]"
            ),
        ),
    ),
    # -- a scheduler item's record outlives neither its weights nor its request
    Mutation(
        "stage-answer-weights-ignored",
        "a stage answer made under replaced weights never moves an item ordered again",
        WORKER_LINK,
        "case StageAnswer(weights=weights) if weights == self.weights:",
        "case StageAnswer(weights=weights):",
        (
            f"{T_LIFECYCLE}::test_a_late_answer_under_old_weights_moves_nothing[staged]",
            f"{T_LIFECYCLE}::test_a_late_answer_under_old_weights_moves_nothing[failed]",
        ),
    ),
    Mutation(
        "expired-ready-item-kept",
        "a staged item whose request ended is released at its deadline",
        WORKER_LINK,
        "        self.prefetch.take_waiters(identifier)\n"
        "        self._to_release.append(identifier)\n",
        "        self.prefetch.take_waiters(identifier)\n",
        (f"{T_LIFECYCLE}::test_a_staged_item_of_an_ended_request_is_released_at_its_deadline",),
    ),
    Mutation(
        "step-report-weights-ignored",
        "a step report made under replaced weights never moves an item ordered again",
        WORKER_LINK,
        "        if meta.weights == self.weights:  # stagings answered under other weights",
        "        if True:  # stagings answered under other weights",
        (
            f"{T_LIFECYCLE}::test_a_step_report_under_old_weights_moves_nothing[staged]",
            f"{T_LIFECYCLE}::test_a_step_report_under_old_weights_moves_nothing[failed]",
        ),
    ),
    Mutation(
        "release-after-a-new-order",
        "a release reaches the worker before a later stage order for the same item",
        WORKER_LINK,
        "            and self._send_releases()\n",
        "",
        (
            f"{T_LIFECYCLE}::"
            "test_an_item_asked_for_again_as_its_release_leaves_is_loaded_from_the_new_copy[v1]",
        ),
    ),
    Mutation(
        "orphaned-staging-keeps-its-slot",
        "a staging no request waits for is given up at its deadline, freeing its slot",
        SCHEDULER,
        "elif state in (S.QUEUED, S.STAGING) and not self.prefetch.waited_on(identifier):",
        "elif False:",
        (
            f"{T_LIFECYCLE}::test_a_staging_no_request_waits_for_gives_its_slot_back_at_its_deadline",
        ),
    ),
    Mutation(
        "restaged-item-counted-twice",
        "an item staged again while staged counts its worker memory once",
        "lmcache_ec/integration/vllm/staged_copies.py",
        "replaced = self.current.get(identifier)  # ordered again before its release",
        "replaced = None",
        (f"{T_LIFECYCLE}::test_an_item_staged_twice_counts_its_memory_once",),
    ),
    # -- the item state machine: enforced, and drawn as it is
    Mutation(
        "illegal-transition-logged",
        "an item moved along a transition ALLOWED does not list is a bug that raises",
        ITEMS,
        "            raise IllegalTransition(\n",
        "            print(\n",
        (f"{T_ITEMS}::test_an_illegal_transition_raises_and_changes_nothing[never-staged]",),
    ),
    Mutation(
        "diagram-misses-a-transition",
        "the state diagram in docs/vllm.md draws every transition items.py allows",
        ITEMS,
        "    S.LOADED: frozenset({S.UNKNOWN}),",
        "    S.LOADED: frozenset({S.UNKNOWN, S.RESIDENT}),",
        (f"{T_ITEMS}::test_the_state_diagram_in_the_docs_is_the_allowed_table",),
    ),
    Mutation(
        "diagram-draws-a-forbidden-transition",
        "the state diagram in docs/vllm.md draws only transitions items.py allows",
        ITEMS,
        "    S.RESIDENT: frozenset({S.UNKNOWN}),",
        "    S.RESIDENT: frozenset({S.UNKNOWN} - {S.UNKNOWN}),",
        (f"{T_ITEMS}::test_the_state_diagram_in_the_docs_is_the_allowed_table",),
    ),
    # -- vLLM's encoder cache reset: what it held is fetched again
    Mutation(
        "encoder-cache-reset-unseen",
        "after vLLM's reset_encoder_cache an image asked for again loads from the tiers",
        "lmcache_ec/integration/vllm/weight_updates.py",
        "        if reset is not None:  # None: another EC connector, or none\n            reset()",
        "        pass",
        (
            f"{T_RESET}::test_an_image_asked_for_after_a_reset_is_fetched_again[v1]",
            f"{T_RESET}::test_an_image_asked_for_after_a_reset_is_fetched_again[v2]",
        ),
    ),
    Mutation(
        "stale-record-trusted",
        "an item vLLM asks about is not in its encoder cache, whatever the record says",
        SCHEDULER,
        "            self._drop_stale(identifier)\n            state = S.UNKNOWN",
        "            pass",
        (
            f"{T_RESET}::test_an_item_vllm_asks_about_is_no_longer_in_its_cache[resident]",
            f"{T_RESET}::test_an_item_vllm_asks_about_is_no_longer_in_its_cache[loaded]",
        ),
    ),
    Mutation(
        "claims-kept-when-a-request-ends",
        "claims of a request that ended unencoded are withdrawn at once",
        SCHEDULER,
        "            self.claims.release_for(request_id)",
        "            pass",
        (f"{T_LIFECYCLE}::test_a_claim_of_an_ended_request_is_withdrawn_at_once",),
    ),
    # -- runtime directories another user took first
    Mutation(
        "runtime-dir-no-alternative",
        "a runtime directory another user holds gives way to one only this user knows",
        RUNTIME_DIRS,
        "        if taken.reason is not Reason.TAKEN:\n",
        "        if True:\n",
        (f"{T_RUNTIME_DIRS}::test_a_taken_directory_gives_way_to_one_only_this_user_knows",),
    ),
    Mutation(
        "runtime-dir-owner-unchecked",
        "nothing is read or written in a runtime directory another user owns",
        RUNTIME_DIRS,
        "        if taken is not None:\n            raise taken\n",
        "",
        (f"{T_RUNTIME_DIRS}::test_a_taken_directory_gives_way_to_one_only_this_user_knows",),
    ),
    Mutation(
        "node-tier-dir-unavailable-is-fatal",
        "without a private directory the engine starts without the node tier",
        "lmcache_ec/storage/manager.py",
        "        except RuntimeDirUnavailable as exc:\n            feature_off(\n",
        "        except ImportError as exc:\n            feature_off(\n",
        (
            f"{T_RUNTIME_DIRS}::"
            "test_without_a_private_directory_the_node_tier_is_off_and_the_engine_serves",
        ),
    ),
    Mutation(
        "ledger-dir-unavailable-loses-writes",
        "without a private directory for the ledger, disk writes still land",
        "lmcache_ec/tiers/budget.py",
        "        return process_dir(), exc",
        "        raise exc",
        (
            f"{T_RUNTIME_DIRS}::"
            "test_without_a_private_directory_the_node_tier_is_off_and_the_engine_serves",
            f"{T_RUNTIME_DIRS}::test_disk_writes_land_when_the_ledger_directory_is_taken",
        ),
    ),
    Mutation(
        "socket-dir-unavailable-is-fatal",
        "without a directory for the stage sockets the scheduler starts and falls back",
        "lmcache_ec/integration/vllm/connector.py",
        "            except RuntimeDirUnavailable as exc:\n                channel, no_channel",
        "            except ImportError as exc:\n                channel, no_channel",
        (f"{T_NO_CHANNEL}::test_the_scheduler_starts_without_a_socket_directory_and_serves_hits",),
    ),
    # -- without a stage channel the weights fingerprint still reaches the scheduler
    Mutation(
        "fingerprint-only-over-the-channel",
        "without a stage channel the scheduler takes the weights from the step reports",
        WORKER_LINK,
        "            self.owner.set_weights(meta.weights, now)",
        "            pass",
        (f"{T_NO_CHANNEL}::test_without_a_channel_the_fingerprint_arrives_with_the_step_reports",),
    ),
    Mutation(
        "weights-change-not-reported",
        "a worker's step report carries a new weights version even with nothing else in it",
        "lmcache_ec/integration/vllm/worker.py",
        '            self._counters["weights_changes"] = '
        'self._counters.get("weights_changes", 0) + 1',
        "            pass",
        (f"{T_NO_CHANNEL}::test_a_weights_change_is_reported_even_with_nothing_else_to_say",),
    ),
    Mutation(
        "caching-pause-unreported",
        "a scheduler that cannot learn the weights says caching is paused, and why",
        KNOWN_WEIGHTS,
        "            off[CACHING] = paused",
        "            pass",
        (
            f"{T_NO_CHANNEL}::test_an_encode_only_instance_on_v1_without_a_channel_says_"
            "caching_is_paused[no socket directory]",
            f"{T_NO_CHANNEL}::test_an_encode_only_instance_on_v1_without_a_channel_says_"
            "caching_is_paused[channel unreachable]",
        ),
    ),
    # -- a weight transfer replaces the encoder chunk by chunk: keys wait for its end
    Mutation(
        "weight-transfer-start-unwatched",
        "no output of an encoder a weight transfer is replacing is saved or loaded",
        "lmcache_ec/integration/vllm/weight_updates.py",
        '    ("vllm.v1.worker.gpu_worker", "Worker", "start_weight_update", REPLACING),\n',
        "",
        (
            "tests/vllm/test_weights.py::"
            "test_nothing_is_saved_or_loaded_while_a_weight_transfer_replaces_the_encoder",
        ),
    ),
    # -- a draft-model transfer leaves the encoder alone: loads go on
    Mutation(
        "draft-transfer-pauses-the-tier",
        "a draft-model weight transfer keeps the encoder's key and its loads",
        "lmcache_ec/integration/vllm/weight_updates.py",
        '"Worker", "start_weight_update", REPLACING)',
        '"Worker", "_start_weight_update", REPLACING)',
        (
            "tests/vllm/test_weights.py::"
            "test_a_draft_model_transfer_keeps_the_encoders_key_and_its_loads",
        ),
    ),
    # -- LMCache's compiled ops may be off (another torch): the tier never needs them
    Mutation(
        "pool-through-lmcache-device-ops",
        "the encoder tier's pool, puts and reads call none of LMCache's device ops",
        "lmcache_ec/tiers/allocator.py",
        "super().__init__(0)  # a zero-byte arena costs nothing; ours replaces it",
        "super().__init__(4096)",
        (
            "tests/upstream/test_lmcache_contract.py::"
            "test_the_encoder_tier_calls_none_of_lmcaches_device_ops",
        ),
    ),
    # -- command output never shows a remote URL's password
    Mutation(
        "stats-shows-the-remote-password",
        "lmcache-ec stats shows the remote URL without its password (table and JSON)",
        "lmcache_ec/cli/entries.py",
        '            "location": redact(config.remote.url),  # never its password\n',
        '            "location": config.remote.url,\n',
        ("tests/cli/test_remote.py::test_stats_shows_the_remote_url_without_its_password",),
    ),
    # -- doctor: a vLLM without a weight seam is a failure, not a pass
    Mutation(
        "doctor-passes-missing-seams",
        "doctor fails when vLLM lacks a method the weight tracking wraps",
        "lmcache_ec/cli/doctor.py",
        "        gone = weight_updates.missing()\n",
        "        gone = []\n",
        ("tests/cli/test_doctor.py::test_doctor_fails_when_a_weight_seam_is_gone",),
    ),
    # -- command tables cut nothing: a long word is folded, even at 80 columns
    Mutation(
        "tables-cut-long-words",
        "a table printed at 80 columns folds a word longer than its column, never cuts it",
        "lmcache_ec/cli/common.py",
        ', overflow="fold")',
        ")",
        (
            "tests/cli/test_doctor.py::"
            "test_a_narrow_console_folds_a_long_name_rather_than_cutting_it",
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
        "a full worker closes a link whose frame stalled to make room for a new one",
        CHANNEL,
        "        for link in stalled:\n"
        '            self._bad_frame(link, f"a frame stalled for {link.reader.deadline_s} s")\n',
        "",
        (
            "tests/chaos/test_stage_channel_partial_frames.py::"
            "test_a_stalled_frame_gives_its_place_up_to_a_new_scheduler_when_the_worker_is_full",
        ),
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
        "each launched engine's stage sockets are its own",
        RUNTIME_DIRS,
        '    path = os.path.join(directory, f"{readable}-{suffix}" if readable else suffix)\n',
        '    path = os.path.join(directory, f"engine-dp{dp_rank}-tp{tp_rank}.sock")\n',
        (
            (
                "tests/vllm/test_stage_channel.py::test_two_engines_on_one_host_each_get_onl"
                "y_their_own_orders"
            ),
        ),
    ),
]


# -- an entry never costs more than it declares (codec.check_stored_size)
T_PADDING = "tests/faults/test_padding.py"
T_BENCH_JOBS = "tests/cli/test_bench_jobs.py::"
MUTATIONS += [
    Mutation(
        "disk-read-sized-by-the-file",
        "a disk or node read allocates the frame's declared size, never the file's",
        "lmcache_ec/tiers/disk_layout.py",
        "frame = np.empty(check_stored_size(prefix, size), dtype=np.uint8)",
        "frame = np.empty(size, dtype=np.uint8)",
        (
            f"{T_PADDING}::test_padded_disk_entry_is_a_counted_miss_and_its_tail_is_never_read",
            "tests/tiers/test_node_tier.py::"
            "test_padded_entry_is_a_miss_removed_without_reading_its_padding",
        ),
    ),
    Mutation(
        "redis-read-unbounded",
        "a Redis read takes at most max_frame_bytes + 1 bytes of a value",
        "lmcache_ec/remote/redis_store.py",
        "    pipe.getrange(key, 0, limit)\n",
        "    pipe.getrange(key, 0, -1)\n",
        (
            f"{T_PADDING}::test_padded_remote_entry_is_a_counted_miss_and_its_tail_is_never_read[redis]",
        ),
    ),
    Mutation(
        "s3-read-unbounded",
        "an S3 read takes at most the declared size + 1 bytes of an object",
        "lmcache_ec/remote/s3_store.py",
        "data = head + body.read(declared + 1 - len(head))",
        "data = head + body.read()",
        (
            f"{T_PADDING}::test_padded_remote_entry_is_a_counted_miss_and_its_tail_is_never_read[s3]",
        ),
    ),
    Mutation(
        "frame-longer-than-declared-accepted",
        "a frame read from a tier is exactly as long as it declares",
        CODEC,
        "    if exact and raw.size != end:\n",
        "    if False:\n",
        (
            f"{T_PADDING}::test_padded_remote_entry_is_a_counted_miss_and_its_tail_is_never_read[redis]",
            f"{T_CODEC}::test_stored_size_must_equal_the_declared_size",
        ),
    ),
    # -- codec checks on every read path
    Mutation(
        "pinned-dtype-not-checked-on-read",
        "a key pinned to a dtype never reads a frame of another dtype",
        CODEC,
        "    if pinned and SUPPORTED_DTYPES[pinned] != dtype:\n",
        "    if False:\n",
        (f"{T_CODEC}::test_dtype_other_than_the_pinned_one_is_rejected_on_every_read_path",),
    ),
    Mutation(
        "payload-longer-than-shape-accepted",
        "a header's shape covers its payload exactly",
        CODEC,
        "math.prod(shape) * dtype.itemsize != payload_len",
        "math.prod(shape) * dtype.itemsize > payload_len",
        (f"{T_CODEC}::test_shape_must_cover_the_payload_exactly[shape0]",),
    ),
    # -- batched remote reads keep their order
    Mutation(
        "redis-batches-out-of-order",
        "get_many's frames come back in the order of their names, batch after batch",
        "lmcache_ec/remote/redis_store.py",
        "            frames += [\n",
        "            frames[:0] = [\n",
        (
            (
                "tests/remote/test_remote_reads.py::test_get_many_of_more_than_one_batch_hit"
                "s_every_entry"
            ),
        ),
    ),
    Mutation(
        "redis-cluster-replies-out-of-order",
        "a cluster's per-shard replies reach their own keys",
        "lmcache_ec/remote/redis_cluster.py",
        "for index, reply in zip(indices, replies, strict=True):",
        "for index, reply in zip(indices[::-1], replies, strict=True):",
        ("tests/cluster/test_redis_cluster.py::test_get_many_of_many_entries_hits_every_one",),
    ),
]

# -- stored embeddings are private to their user unless shared with a group
MUTATIONS += [
    Mutation(
        "disk-tier-readable-by-everyone",
        "the disk directory is made 0700 and its entries 0600 unless group-shared",
        "lmcache_ec/tiers/disk_layout.py",
        "return cls(0o2770, 0o660) if group_shared else cls(0o700, 0o600)",
        "return cls(0o2770, 0o660) if group_shared else cls(0o755, 0o644)",
        (f"{T_DISK}::test_directory_and_entries_are_private_unless_shared_with_a_group[private]",),
    ),
    Mutation(
        "group-shared-modes-left-to-the-umask",
        "a group-shared directory's entries are 0660 whatever the umask",
        "lmcache_ec/tiers/disk_layout.py",
        "        os.fchmod(fd, mode)  # the umask may have taken group bits\n",
        "        pass\n",
        (
            f"{T_DISK}::test_directory_and_entries_are_private_unless_shared_with_a_group"
            "[group-shared]",
        ),
    ),
]

# -- the disk budget: the ledger equals the bytes on disk, a scan never forgets a write
T_BUDGET = "tests/tiers/test_disk_budget.py"
T_LAYOUT = "tests/tiers/test_disk_layout.py"
MUTATIONS += [
    Mutation(
        "ledger-keeps-removed-bytes",
        "a removal by the tier gives its bytes back to the ledger",
        "lmcache_ec/tiers/budget.py",
        "            used = self._read() if held else None\n",
        "            used = None\n",
        (f"{T_BUDGET}::test_the_ledger_equals_the_bytes_on_disk_after_a_removal_and_a_lost_race",),
    ),
    Mutation(
        "lost-publish-keeps-its-reservation",
        "a write that loses the publish race gives its reservation back",
        "lmcache_ec/tiers/frame_directory.py",
        "        if not published:\n            self.budget.give_back(temp, size)\n",
        "        if not published:\n            pass\n",
        (f"{T_LEDGER_RACES}::{_GIVE_BACK_RACING}[lost-publish-race]",),
    ),
    Mutation(
        "removal-subtracts-outside-lock",
        "a removal racing another process's scan never under-counts the ledger",
        "lmcache_ec/tiers/budget.py",
        "        self._own.discard(name)\n"
        "        return self._delete_and_subtract(self.layout.path_of(name), None)\n",
        "        self._own.discard(name)\n"
        "        path = self.layout.path_of(name)\n"
        "        size = os.stat(path).st_size\n"
        "        os.remove(path)\n"
        "        with contextlib.suppress(OSError), self._locked():\n"
        "            self._write((self._read() or 0) - size)\n"
        "        return True\n",
        (f"{T_LEDGER_RACES}::test_a_removal_racing_another_process_scan_never_under_counts",),
    ),
    Mutation(
        "give-back-subtracts-outside-lock",
        "a reservation given back (lost race or failed write) never under-counts the ledger",
        "lmcache_ec/tiers/budget.py",
        "            return self._delete_and_subtract(temp, size)\n",
        "            with contextlib.suppress(FileNotFoundError):\n"
        "                os.remove(temp)\n"
        "            with self._locked():\n"
        "                self._write((self._read() or 0) - size)\n"
        "            return True\n",
        (f"{T_LEDGER_RACES}::{_GIVE_BACK_RACING}[lost-publish-race]",),
    ),
    Mutation(
        "scan-forgets-a-write-published-meanwhile",
        "a write published between a scan's listing and its stat counts at its reservation",
        "lmcache_ec/tiers/disk_layout.py",
        "                        writes[item.inode()] = reserved\n",
        "                        pass\n",
        (f"{T_LAYOUT}::test_a_write_published_between_listing_and_stat_counts_at_its_reservation",),
    ),
    # -- layout: the import graph has no cycle; the docs name files that exist
    Mutation(
        "bench-import-cycle",
        "the import graph has no cycle (the benchmarks included)",
        "lmcache_ec/bench/run.py",
        "from .job_protocol import run_in_worker\n",
        "from . import fleet  # noqa: F401\nfrom .job_protocol import run_in_worker\n",
        ("tests/test_layers.py::test_the_import_graph_has_no_cycle",),
    ),
    Mutation(
        "docs-name-a-renamed-file",
        "a file the docs name exists (a renamed module shows)",
        "docs/architecture.md",
        "through `weight_updates.py`, the one module",
        "through `seams.py`, the one module",
        ("tests/test_docs.py::test_files_named_exist[docs/architecture.md]",),
    ),
    # -- a late promotion never outranks newer entries in the CPU tier's LRU
    Mutation(
        "late-promotion-goes-to-the-front",
        "a promoted old entry takes its place in the CPU tier's use order as of its read",
        "lmcache_ec/storage/reads.py",
        "self._write_above(key, memory_obj, above, purges, since)",
        "self._write_above(key, memory_obj, above, purges)",
        (
            (
                "tests/storage/test_reads.py::test_a_promotion_that_lands_after_newer_puts_r"
                "anks_behind_them"
            ),
        ),
    ),
]

# -- purges: none lost, records untrusted, each scoped to its own namespace
T_PURGE = "tests/purge/test_purge_log.py"
MARKER = "lmcache_ec/purge/marker.py"
MUTATIONS += [
    Mutation(
        "redis-purge-log-overwritten",
        "a purge appended to the Redis log never replaces another made at once",
        "lmcache_ec/remote/redis_store.py",
        "        self._client.eval(APPEND_LOG, 1, name, line, limit)\n",
        "        self._client.set(name, line)\n",
        (
            f"{T_PURGE}::test_two_tenants_purging_within_one_interval_are_both_applied[redis]",
            f"{T_PURGE}::test_appends_made_at_once_are_all_kept_remotely[redis]",
        ),
    ),
    Mutation(
        "s3-purge-log-put-unconditionally",
        "a purge appended to the S3 log never replaces another made at once",
        "lmcache_ec/remote/s3_store.py",
        "Body=appended(log, line, limit), **condition, **self._object(name)",
        "Body=appended(log, line, limit), **self._object(name)",
        (f"{T_PURGE}::test_appends_made_at_once_are_all_kept_remotely[s3]",),
    ),
    Mutation(
        "disk-purge-log-unlocked",
        "purges appended to the disk log at once are all kept",
        MARKER,
        '        flock_within(fd, APPEND_LOCK_S, f"the purge logs\' directory {directory}")\n',
        "        pass\n",
        (f"{T_PURGE}::test_appends_made_at_once_are_all_kept_on_disk",),
    ),
    Mutation(
        "purge-log-read-whole",
        "a reader takes at most LOG_LIMIT + 1 bytes of a purge log",
        "lmcache_ec/remote/redis_store.py",
        "return _as_bytes(self._client.getrange(name, -size, -1)) or None",
        "return _as_bytes(self._client.getrange(name, 0, -1)) or None",
        (f"{T_PURGE}::test_a_long_log_is_read_as_its_tail",),
    ),
    Mutation(
        "record-of-another-namespace-accepted",
        "a record naming another namespace than its log's is rejected",
        MARKER,
        '        if texts["namespace"] is not None and texts["namespace"] != namespace:\n',
        "        if False:\n",
        (
            f"{T_PURGE}::test_a_record_selects_only_its_own_namespace",
            f"{T_PURGE}::test_a_bad_record_is_rejected[other-namespace]",
        ),
    ),
    Mutation(
        "unscoped-record-selects-every-namespace",
        "a record selects only entries of the namespace whose log holds it",
        MARKER,
        "            namespace=namespace,\n",
        "            namespace=self.namespace,\n",
        (f"{T_PURGE}::test_a_record_selects_only_its_own_namespace",),
    ),
    Mutation(
        "nan-purge-time-accepted",
        "a record's times are finite",
        MARKER,
        "not math.isfinite(value) or value < 0",
        "value < 0",
        (
            f"{T_PURGE}::test_a_bad_record_is_rejected[nan-time]",
            f"{T_PURGE}::test_a_bad_record_is_rejected[nan-age]",
        ),
    ),
    Mutation(
        "future-purge-time-kept",
        "a record's time is clamped to the reader's clock",
        MARKER,
        "            min(when, now),\n",
        "            when,\n",
        (
            f"{T_PURGE}::test_a_record_from_the_future_is_clamped_to_the_readers_clock",
            "tests/purge/test_purge_outcomes.py::"
            "test_a_record_a_little_ahead_of_the_clock_is_clamped_and_one_far_ahead_rejected",
        ),
    ),
    Mutation(
        "deeply-nested-record-raises",
        "a deeply nested record is a bad record, never a RecursionError",
        MARKER,
        "except (ValueError, RecursionError) as exc:  # RecursionError: deep nesting",
        "except ValueError as exc:",
        (f"{T_PURGE}::test_a_bad_record_is_rejected[nested-4k]",),
    ),
    Mutation(
        "disk-log-link-followed",
        "the disk purge log is opened without following a link",
        MARKER,
        "os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC",
        "os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC",
        (f"{T_PURGE}::test_only_a_regular_file_is_read_as_the_disk_log[link]",),
    ),
    Mutation(
        "disk-log-open-blocks-on-a-fifo",
        "the disk purge log is opened without blocking (a FIFO there never stalls)",
        MARKER,
        "os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC",
        "os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC",
        (f"{T_PURGE}::test_only_a_regular_file_is_read_as_the_disk_log[fifo]",),
    ),
    # -- get_or_compute: one computation per entry, in a process and across instances
    Mutation(
        "single-flight-every-caller-leads",
        "threads of one process asking for one new entry share one computation",
        SINGLE_FLIGHT,
        "            if flight is not None:\n                flight.followers += 1\n",
        "            if False:\n                flight.followers += 1\n",
        (f"{T_GET_OR_COMPUTE}::test_threads_asking_for_one_new_key_share_one_compute",),
    ),
    Mutation(
        "single-flight-followers-share-a-tensor",
        "every caller of get_or_compute receives its own tensor",
        GET_OR_COMPUTE,
        "found[mm_hash] = flight.result.to(target, copy=True)",
        "found[mm_hash] = flight.result",
        (f"{T_GET_OR_COMPUTE}::test_threads_asking_for_one_new_key_share_one_compute",),
    ),
    Mutation(
        "claim-lost-computes-anyway",
        "an instance that meets another's claim waits for its output (library and connector)",
        SINGLE_FLIGHT,
        "return Turn.COMPUTE if won else Turn.WAIT",
        "return Turn.COMPUTE",
        (
            f"{T_GET_OR_COMPUTE}::test_an_instance_waits_for_anothers_computation_and_loads_it",
            f"{T_REMOTE_GET_OR_COMPUTE}::test_an_instance_loads_what_another_computes[redis]",
            (
                "tests/vllm/test_claims.py::test_an_image_reaching_two_instances_is_encoded_"
                "once[redis]"
            ),
        ),
    ),
    Mutation(
        "claim-wait-unbounded",
        "a dead claim holder delays others at most the bound",
        SINGLE_FLIGHT,
        "        if claim_free or now >= deadline:\n",
        "        if claim_free:\n",
        (
            f"{T_GET_OR_COMPUTE}::test_a_killed_holder_delays_others_at_most_the_bound",
            f"{T_REMOTE_GET_OR_COMPUTE}::test_a_killed_holder_delays_others_at_most_the_bound[redis]",
        ),
    ),
    Mutation(
        "failed-compute-keeps-its-claim",
        "a compute that raises (or returns a refused result) withdraws its claim",
        GET_OR_COMPUTE,
        "            if agent is not None:\n                for mm_hash in hashes:\n",
        "            if False:\n                for mm_hash in hashes:\n",
        (
            f"{T_GET_OR_COMPUTE}::test_a_hostile_result_is_a_clear_error_and_nothing_is_stored[wrong-dtype]",
        ),
    ),
    Mutation(
        "waiter-never-claims-again",
        "a waiter whose claim store goes down computes (bounded), not waits out the bound",
        GET_OR_COMPUTE,
        "frees = agent.ask_many([names[h] for h in waiting], ttl) if agent else []",
        "frees = [None] * len(waiting)",
        (f"{T_REMOTE_GET_OR_COMPUTE}::test_a_store_going_down_mid_wait_falls_back_to_computing",),
    ),
    Mutation(
        "compute-waits-for-itself",
        "a compute asking for its own entry in its own thread is a clear error, never a stall",
        GET_OR_COMPUTE,
        "            elif flight.leader != threading.get_ident():\n",
        "            elif True:\n",
        (
            f"{T_GET_OR_COMPUTE}::test_a_compute_asking_for_its_own_key_is_a_clear_error_not_a_stall",
            f"{T_GET_OR_COMPUTE}::test_a_compute_may_ask_for_other_keys_but_not_its_own_in_a_batch",
        ),
    ),
    Mutation(
        "claims-sent-key-by-key",
        "a batch of claims is one round trip to Redis, however many keys it holds",
        "lmcache_ec/claims.py",
        "                if claim_many is not None and len(order.names) > 1:\n",
        "                if False:\n",
        (
            f"{T_REMOTE_GET_OR_COMPUTE}::"
            "test_the_batched_form_claims_any_number_of_new_keys_in_one_round_trip",
            f"{T_REMOTE_GET_OR_COMPUTE}::"
            "test_a_batched_wait_claims_and_looks_up_every_key_in_one_round_trip_a_look",
        ),
    ),
    Mutation(
        "claim-released-before-the-write-lands",
        "a holder withdraws its claim only once its output reached the shared tier",
        GET_OR_COMPUTE,
        "after=(lambda k=key: not self._cache.writing_below(k)) if stored else None,",
        "after=None,",
        (
            f"{T_GET_OR_COMPUTE}::"
            "test_a_holder_keeps_its_claim_until_its_output_reached_the_shared_tier",
        ),
    ),
    Mutation(
        "hostile-result-not-checked",
        "a result of the wrong dtype is a clear error and nothing is stored",
        "lmcache_ec/storage/compute_results.py",
        "            validate_tensor(tensor, identity.dtype)\n        except",
        "            pass\n        except",
        (
            f"{T_GET_OR_COMPUTE}::test_a_hostile_result_is_a_clear_error_and_nothing_is_stored[wrong-dtype]",
            f"{T_GET_OR_COMPUTE}::test_a_batch_with_a_hostile_member_stores_none_of_it",
        ),
    ),
    Mutation(
        "purge-watch-stops-on-an-error",
        "the purge watch thread outlives any exception",
        "lmcache_ec/purge/follow.py",
        "                except Exception as exc:  # the watch outlives anything one check does\n"
        "                    self._failed(exc)\n",
        "                except Exception:\n                    return\n",
        (f"{T_PURGE}::test_the_watch_thread_survives_any_exception",),
    ),
    # -- new encoder weights mid-call: nothing keyed or stored under the wrong identity
    Mutation(
        "key-memo-outlives-identity",
        "a key made across set_identity is never remembered for the new identity",
        ENGINE,
        "                memo[mm_hash] = key",
        "                self._keying[1][mm_hash] = key",
        (
            (
                "tests/test_engine.py::test_a_key_made_across_set_identity_is_not_kept_for_t"
                "he_new_identity"
            ),
        ),
    ),
    Mutation(
        "get-or-compute-stores-across-identity",
        "get_or_compute never stores a result computed across set_identity",
        GET_OR_COMPUTE,
        "changed = self._cache.identity is not identity",
        "changed = False",
        (
            f"{T_GET_OR_COMPUTE}::"
            "test_a_result_computed_across_new_weights_is_returned_but_never_stored",
        ),
    ),
    # -- a purge left incomplete by an I/O error is applied again, never lost
    Mutation(
        "purge-stops-at-a-failed-deletion",
        "an entry a purge cannot delete stops no other deletion",
        "lmcache_ec/purge/follow.py",
        'undone.append(f"{entry.path}: {exc.strerror or exc}")',
        "raise",
        (f"{T_PURGE_FAILURES}::test_an_entry_left_by_an_io_error_is_deleted_at_the_next_check",),
    ),
    Mutation(
        "incomplete-purge-forgotten",
        "a purge left incomplete is applied again at the next check, counted only once complete",
        "lmcache_ec/purge/marker.py",
        "            self._retry_later(marker.generation, tier)\n",
        "            pass\n",
        (f"{T_PURGE_FAILURES}::test_an_entry_left_by_an_io_error_is_deleted_at_the_next_check",),
    ),
    Mutation(
        "incomplete-disk-purge-not-read-again",
        "a purge from the disk log left incomplete is read again though the log did not change",
        "lmcache_ec/purge/marker.py",
        "                self._disk_signature = None  # re-read the log though it did not change\n",
        "                pass\n",
        (f"{T_PURGE_FAILURES}::test_an_incomplete_purge_from_the_disk_log_is_read_again",),
    ),
    # -- a save whose host copy fails never reaches the forward pass
    Mutation(
        "failed-save-handoff-raises",
        "a failed host copy is a dropped save: never raised into vLLM, its slot given back",
        "lmcache_ec/integration/vllm/saver.py",
        "except Exception as exc:  # raised into vLLM's forward pass, it would kill the worker",
        "except ImportError as exc:",
        (
            "tests/vllm/test_saver_failures.py::"
            "test_the_queue_gives_a_failed_hand_off_its_slot_back",
        ),
    ),
    # -- Redis: a key of another type is damage, not an outage; a mute sentinel is asked once
    Mutation(
        "redis-wrong-type-is-an-outage",
        "a Redis key of another type is a counted miss, removed; the tier stays available",
        "lmcache_ec/remote/redis_store.py",
        "replies = pipe.execute(raise_on_error=False)  # one bad key fails only itself",
        "replies = pipe.execute()",
        (
            "tests/faults/test_corruption.py::"
            "test_a_redis_key_of_another_type_is_a_counted_miss_and_is_removed[redis]",
        ),
    ),
    Mutation(
        "remote-read-without-whole-deadline",
        "a server sending a value a byte at a time holds a read no longer than the timeout",
        "lmcache_ec/remote/backend.py",
        "            return self._deadline.run(call, _unwrapped(connection), late=late)\n",
        "            return call(_unwrapped(connection))\n",
        (
            "tests/faults/test_remote_outages.py::"
            "test_a_server_that_answers_a_byte_at_a_time_holds_no_read_past_the_timeout[redis]",
        ),
    ),
    Mutation(
        "late-read-not-cut",
        "a read given up is cut off the store, not left reading",
        "lmcache_ec/remote/deadline.py",
        "            self._abort()\n",
        "            pass\n",
        (
            "tests/faults/test_remote_outages.py::"
            "test_a_server_that_answers_a_byte_at_a_time_holds_no_read_past_the_timeout[redis]",
        ),
    ),
    Mutation(
        "catalog-log-read-without-deadline",
        "the purge log is read whole within the timeout, not byte by byte",
        "lmcache_ec/remote/catalog.py",
        "        return self._deadline.run(self.store.read_log, name, size)\n",
        "        return self.store.read_log(name, size)\n",
        (
            "tests/remote/test_catalog.py::"
            "test_a_store_sending_a_byte_at_a_time_holds_no_read_past_the_timeout[redis]",
        ),
    ),
    Mutation(
        "cpu-pool-refused-is-fatal",
        "a CPU pool larger than the host grants is a smaller pool, not a failed start",
        "lmcache_ec/tiers/allocator.py",
        "            refusal, size = exc, size // 2 // _PAGE * _PAGE\n            continue\n",
        "            raise\n",
        (
            "tests/test_engine.py::"
            "test_a_cpu_pool_larger_than_the_host_grants_is_a_smaller_pool_not_a_failed_start",
        ),
    ),
    Mutation(
        "followers-share-the-leaders-tensor",
        "followers get the computed tensor whatever the leader's caller does with its own",
        "lmcache_ec/storage/get_or_compute.py",
        "share=_detached_copy)",
        "share=None)",
        (
            (
                "tests/test_get_or_compute.py::test_followers_get_the_computed_tensor_whatev"
                "er_the_leaders_caller_does_with_its_own"
            ),
        ),
    ),
    Mutation(
        "twice-asked-hash-aliased",
        "a hash asked twice in a batch gets two tensors",
        "lmcache_ec/storage/get_or_compute.py",
        "found[mm_hash].clone() if mm_hash in seen else found[mm_hash]",
        "found[mm_hash]",
        (
            (
                "tests/test_get_or_compute.py::test_a_hash_asked_twice_in_a_batch_gets_two_t"
                "ensors[computed]"
            ),
        ),
    ),
    Mutation(
        "unit-dim-stride-viewed-as-bytes",
        "a contiguous tensor whose unit last dim has another stride is stored exactly",
        "lmcache_ec/codec.py",
        "        or tensor.stride(-1) != 1\n",
        "",
        ("tests/test_engine.py::test_a_batch_holding_a_transposed_row_is_stored_whole",),
    ),
    Mutation(
        "long-headers-kept-in-parse-cache",
        "a long header (a huge mm_hash) is verified but not kept in the parse cache",
        "lmcache_ec/codec.py",
        "        if len(data) <= _PARSED_MAX_LEN:\n",
        "        if True:\n",
        ("tests/test_codec.py::test_a_long_header_is_verified_but_not_kept_in_the_parse_cache",),
    ),
    Mutation(
        "no-tier-put-reports-stored",
        "with no tier holding entries a put says it stored nothing",
        "lmcache_ec/engine.py",
        "        if self._stores_nothing:\n"
        '            self.stats.add("put_rejected")\n'
        "            return False\n",
        "",
        ("tests/test_engine.py::test_with_no_tier_holding_entries_a_put_says_it_stored_nothing",),
    ),
    Mutation(
        "promotion-across-a-purge-kept",
        "a read in flight across a purge does not store its entry again",
        "lmcache_ec/storage/reads.py",
        "            if self._purges_applying or self._purges_begun != purges:\n"
        "                return\n",
        "",
        (
            (
                "tests/purge/test_purge_races.py::test_a_read_in_flight_across_a_purge_does_"
                "not_store_its_entry_again"
            ),
        ),
    ),
    Mutation(
        "disk-purge-not-rescanned",
        "an entry a read wrote back before the engine saw the purge is deleted",
        "lmcache_ec/purge/follow.py",
        "            undone = []\n            self._rescan_later(marker)\n",
        "            undone = []\n",
        (
            (
                "tests/purge/test_purge_races.py::test_an_entry_a_read_wrote_back_before_the"
                "_engine_saw_the_purge_is_deleted"
            ),
        ),
    ),
    Mutation(
        "old-remote-purge-skipped",
        "an engine started after a remote purge applies it to its own disk",
        "lmcache_ec/purge/marker.py",
        '            if tier == "remote" and self._on_old_remote is not None:\n',
        "            if False:\n",
        (
            (
                "tests/purge/test_purge_races.py::test_an_engine_started_after_a_remote_purg"
                "e_applies_it_to_its_own_disk"
            ),
        ),
    ),
    Mutation(
        "purge-record-too-long-for-readers",
        "a purge too long for its readers deletes nothing",
        "lmcache_ec/purge/marker.py",
        "            if value is not None and len(value) > _TEXT_LIMIT:\n",
        "            if False:\n",
        ("tests/purge/test_purge_races.py::test_a_purge_too_long_for_its_readers_deletes_nothing",),
    ),
    Mutation(
        "identity-namespace-switch-allowed",
        "an identity of another namespace is refused",
        "lmcache_ec/engine.py",
        "        if identity.namespace != self.config.namespace:\n",
        "        if False:\n",
        ("tests/purge/test_purge_races.py::test_an_identity_of_another_namespace_is_refused",),
    ),
    Mutation(
        "request-waits-beyond-its-room",
        "a request needing more items than the bounds loads what fits and computes the rest",
        DECISIONS,
        "        if not room.fits(nbytes):\n",
        "        if False:\n",
        (
            (
                "tests/vllm/test_item_lifecycle.py::test_a_request_needing_more_items_than_t"
                "he_bounds_loads_what_fits_and_computes_the_rest[ec_consumer]"
            ),
        ),
    ),
    Mutation(
        "computed-output-not-saved-again",
        "an output computed again after it left the tiers is saved again",
        "lmcache_ec/integration/vllm/worker.py",
        "            identity = self.cache.identity if self.weights is not None else None\n",
        # the shortcut this guarantee removed: an item saved once is never saved again
        "            identity = self.cache.identity if self.weights is not None else None\n"
        "            seen = self.__dict__.setdefault('_seen', set())\n"
        "            if mm_hash in seen:\n"
        "                return\n"
        "            seen.add(mm_hash)\n",
        (
            "tests/vllm/test_roles.py::"
            "test_an_output_computed_again_after_it_left_the_tiers_is_saved_again",
        ),
    ),
    Mutation(
        "queued-upload-tried-after-down",
        "uploads queued when the tier went down are remembered, not tried",
        "lmcache_ec/remote/backend.py",
        "            if self._closed or not self.health.up:  # queued before the tier went down\n",
        "            if False:\n",
        (
            (
                "tests/faults/test_remote_recovery.py::test_uploads_queued_when_the_tier_wen"
                "t_down_are_remembered_not_tried"
            ),
        ),
    ),
    Mutation(
        "replay-skips-what-finds-no-room",
        "every write of an outage is re-sent, however small the CPU pool",
        "lmcache_ec/storage/replay.py",
        "        return memory_obj, memory_obj is None and bool(refused)\n",
        "        return memory_obj, False\n",
        (
            (
                "tests/faults/test_remote_recovery.py::test_every_write_of_an_outage_is_re_s"
                "ent_through_a_small_pool"
            ),
        ),
    ),
    Mutation(
        "replay-before-reading-purges",
        "a purge recorded during an outage is not undone by the replay",
        "lmcache_ec/storage/replay.py",
        "            if not self._read_purges():\n",
        "            if False:\n",
        (
            (
                "tests/faults/test_remote_recovery.py::test_a_purge_recorded_during_an_outag"
                "e_is_not_undone_by_the_replay"
            ),
        ),
    ),
    Mutation(
        "remove-outside-deadline",
        "removing a damaged entry from a slow server is bounded like a read",
        "lmcache_ec/remote/backend.py",
        "        if self._has_blocking_reads():  # ours: a whole call within the timeout\n",
        "        if False:\n",
        (
            (
                "tests/faults/test_remote_outages.py::test_removing_a_damaged_entry_from_a_s"
                "low_server_holds_no_read_past_the_timeout"
            ),
        ),
    ),
    Mutation(
        "get-or-compute-waits-before-computing-won",
        "instances that each won what the other waits for never wait on each other",
        "lmcache_ec/storage/get_or_compute.py",
        # what was won is computed after the wait, with what the wait gave up on
        "        if won:\n"
        "            try:\n"
        "                self._compute_and_store("
        "won, names, compute, device, wait_s, identity, results)\n"
        "            except BaseException:\n"
        "                for mm_hash in waiting:  "
        "# a claim asked for them may yet be answered ours\n"
        "                    if agent is not None:\n"
        "                        agent.release(names[mm_hash])\n"
        "                raise\n"
        "            self._land(flights, won, results)  "
        "# its followers need not wait for the others\n"
        "        late = self._wait_for_others(\n"
        "            waiting, names, identity, device, rule, deadline, results, flights\n"
        "        )\n",
        (
            "        late = won + self._wait_for_others(\n"
            "            waiting, names, identity, device, rule, deadline, results, flights\n"
            "        )\n"
        ),
        (
            "tests/test_get_or_compute.py::"
            "test_batches_in_opposite_orders_compute_what_they_won_before_waiting",
        ),
    ),
    Mutation(
        "deadline-ended-call-blamed",
        "a read that ends as its wait times out gives its answer",
        "lmcache_ec/remote/deadline.py",
        "                return future.result()\n",
        "                raise\n",
        (
            (
                "tests/remote/test_deadline.py::test_a_call_ending_as_its_wait_times_out_giv"
                "es_its_answer"
            ),
        ),
    ),
    Mutation(
        "busy-readers-blame-the-store",
        "a read that finds every reader thread busy is not the store's fault",
        "lmcache_ec/remote/deadline.py",
        "        if not started.wait(self.seconds) and future.cancel():\n",
        "        if False:\n",
        (
            (
                "tests/remote/test_deadline.py::test_a_call_that_finds_every_thread_busy_is_"
                "not_the_stores_fault"
            ),
        ),
    ),
    Mutation(
        "batch-read-bound-as-a-whole",
        "each request of a batch read has the bound, not the whole batch",
        "lmcache_ec/remote/store.py",
        "READ_BATCH = 32  # names a request of a batch read: one Redis pipeline, one bound\n",
        "READ_BATCH = 10**9\n",
        (
            (
                "tests/remote/test_remote_reads.py::test_a_batch_longer_than_one_timeout_is_"
                "read_whole_from_a_healthy_slow_store"
            ),
        ),
    ),
    Mutation(
        "failed-share-hangs-followers",
        "followers whose copy cannot be made ask again and never hang",
        "lmcache_ec/storage/single_flight.py",
        "        except Exception:  # no copy for them (out of memory): they ask again\n"
        "            result = None\n",
        "        except Exception:\n            raise\n",
        (
            (
                "tests/test_get_or_compute.py::test_followers_whose_copy_cannot_be_made_ask_"
                "again_and_never_hang"
            ),
        ),
    ),
    Mutation(
        "markup-in-errors",
        "error text is printed as it is, never as Rich markup",
        "lmcache_ec/cli/common.py",
        'err_console.print(f"[bold red]error:[/] {escape(message)}")',
        'err_console.print(f"[bold red]error:[/] {message}")',
        (
            (
                "tests/cli/test_invalid_inputs.py::test_a_config_path_that_looks_like_markup"
                "_is_printed_as_it_is"
            ),
        ),
    ),
    Mutation(
        "empty-key-skips-checks",
        "a key left empty whose default is set is a ConfigError naming it",
        "lmcache_ec/config.py",
        "if coerced is None and opt.default is not None:",
        "if coerced is None and opt.default is not None and False:",
        (
            (
                "tests/test_config.py::test_a_key_left_empty_is_an_error_unless_its_default_"
                "is_unset[namespace]"
            ),
        ),
    ),
    Mutation(
        "metrics-url-traceback",
        "a --metrics-url that is not a URL exits 2 with a message",
        "lmcache_ec/cli/entries.py",
        "except (ValueError, InvalidURL) as exc:",
        "except (TypeError, KeyError) as exc:",
        (
            (
                "tests/cli/test_invalid_inputs.py::test_a_metrics_url_that_is_no_url_is_a_us"
                "age_error[http://localhost:abc/metrics]"
            ),
        ),
    ),
    Mutation(
        "header-created-unchecked",
        "a header whose created is not a finite number is corrupt",
        "lmcache_ec/codec.py",
        '    created = header.get("created", 0.0)\n',
        "    created = 0.0\n",
        (
            "tests/test_codec.py::test_header_with_a_valid_checksum_but_hostile_content_is_rejected"
            "[created-text-bad created]",
        ),
    ),
    Mutation(
        "nan-purge-record",
        "no purge record that engines reject is ever written",
        "lmcache_ec/purge/marker.py",
        "            math.isfinite(self.older_than) and self.older_than >= 0\n",
        "            True\n",
        (
            (
                "tests/cli/test_invalid_inputs.py::test_a_purge_record_no_engine_would_read_"
                "is_refused_before_it_is_written[nan]"
            ),
        ),
    ),
    Mutation(
        "unbounded-timeouts",
        "time settings past one day are a ConfigError, never an OverflowError",
        "lmcache_ec/config_schema.py",
        "return None if value <= MAX_SECONDS else",
        "return None if value <= math.inf else",
        ("tests/cli/test_invalid_inputs.py::test_doctor_refuses_a_timeout_past_any_use",),
    ),
    Mutation(
        "password-in-config-error",
        "config errors never show a remote password",
        "lmcache_ec/config.py",
        "            shown = redact_text(shown)\n",
        "            pass\n",
        (
            (
                "tests/test_config.py::test_a_config_error_never_shows_a_password[section0-r"
                "edis://u:***@h:1]"
            ),
        ),
    ),
    Mutation(
        "local-disk-origin",
        "a local_disk error names where the value came from",
        "lmcache_ec/config.py",
        "raise ConfigError(f\"{where}: 'local_disk' takes one directory for the encoder tier\")",
        "raise ConfigError(\"'local_disk' takes one directory for the encoder tier\")",
        (
            (
                "tests/test_config.py::test_a_local_disk_of_several_directories_names_where_"
                "it_came_from"
            ),
        ),
    ),
    Mutation(
        "upper-case-ec-ignored",
        "the ec section is found in any letter case",
        "lmcache_ec/config.py",
        'spellings = [key for key in document if str(key).lower() == "ec"]',
        'spellings = [key for key in document if key == "ec"]',
        ("tests/test_config.py::test_the_ec_section_is_found_in_any_letter_case",),
    ),
    Mutation(
        "config-doc-not-utf8",
        "config-doc on a file that is not UTF-8 exits 2",
        "lmcache_ec/cli/reference.py",
        "except (OSError, ValueError) as exc:",
        "except OSError as exc:",
        (
            (
                "tests/cli/test_invalid_inputs.py::test_config_doc_check_of_a_file_that_is_n"
                "ot_utf8_is_a_usage_error"
            ),
        ),
    ),
    Mutation(
        "doctor-invalid-config-exit",
        "doctor exits 2 on an invalid configuration",
        "lmcache_ec/cli/doctor.py",
        "raise typer.Exit(1 if loaded is not None else 2)",
        "raise typer.Exit(1)",
        ("tests/cli/test_doctor.py::test_doctor_names_an_invalid_key",),
    ),
    Mutation(
        "replay-trusts-an-incomplete-purge",
        "a replay does not trust a purge log read that left a purge incomplete",
        "lmcache_ec/purge/follow.py",
        "            return not self.watch.retrying()\n",
        "            return True\n",
        (
            "tests/purge/test_purge_failures.py::"
            "test_a_replay_does_not_trust_a_purge_log_read_that_left_a_purge_incomplete",
        ),
    ),
    Mutation(
        "read-during-a-purge-promoted",
        "a read begun while a purge is applied is not promoted",
        "lmcache_ec/storage/reads.py",
        "        return -1 if self._purges_applying else self._purges_begun\n",
        "        return self._purges_begun\n",
        (
            (
                "tests/purge/test_purge_races.py::test_a_read_begun_while_a_purge_is_applied"
                "_is_not_promoted"
            ),
        ),
    ),
    Mutation(
        "rescan-waits-for-every-write",
        "a purge rescan waits only for the writes in flight when it began",
        "lmcache_ec/purge/follow.py",
        "        while any(keys & each.writes_in_flight() for each, keys in waited):\n",
        "        while any(each.writes_in_flight() for each, keys in waited):\n",
        (
            (
                "tests/purge/test_purge_races.py::test_a_rescan_waits_only_for_the_writes_in"
                "_flight_when_it_began"
            ),
        ),
    ),
    Mutation(
        "sentinel-client-retries",
        "a sentinel that never answers is asked once a discovery, not ten times with backoff",
        "lmcache_ec/remote/redis_store.py",
        '            "retry": Retry(NoBackoff(), 0),\n',
        "",
        (
            "tests/remote/test_sentinel.py::"
            "test_a_sentinel_that_never_answers_is_asked_once_a_discovery",
        ),
    ),
    # -- bad values are a clear error at load, never one at the engine's start
    Mutation(
        "remote-serde-unchecked",
        "a remote_serde other than naive is a ConfigError naming the key",
        "lmcache_ec/config_schema.py",
        "            check=_naive_serde,\n",
        "",
        ("tests/test_config.py::test_invalid_values_name_the_key[section12-remote_serde]",),
    ),
    Mutation(
        "infinite-whole-number-traceback",
        "an infinite value for a whole-number key is a ConfigError naming the key",
        "lmcache_ec/config.py",
        "except (ValueError, TypeError, OverflowError, RecursionError) as exc:",
        "except (ValueError, TypeError, RecursionError) as exc:",
        ("tests/test_config.py::test_invalid_values_name_the_key[section13-read_threads]",),
    ),
    Mutation(
        "connector-option-accepts-nan",
        "a connector option that is not a finite number is a ConfigError naming it",
        "lmcache_ec/integration/vllm/connector_options.py",
        "    if isinstance(value, bool) or _not_finite(number) or number < 0:\n",
        "    if isinstance(value, bool) or number < 0:\n",
        (
            "tests/test_config.py::"
            "test_connector_options_refuse_what_is_not_a_finite_number_at_least_zero"
            "[stage_timeout_s-nan]",
        ),
    ),
    Mutation(
        "doctor-makes-a-wide-disk-dir",
        "doctor makes a missing disk directory with the engine's modes",
        "lmcache_ec/cli/doctor.py",
        "make_directory(directory, DirectoryModes.of(config.local_disk_group_shared))",
        "os.makedirs(directory, exist_ok=True)",
        (
            "tests/cli/test_doctor.py::"
            "test_doctor_makes_a_missing_disk_dir_as_the_engine_would[False-448]",
        ),
    ),
    # -- Redis Cluster: the client is built outside the lock, once, and not again at once
    Mutation(
        "cluster-build-under-lock",
        "no call waits on the store's lock while the cluster client is built",
        "lmcache_ec/remote/cluster_slots.py",
        "                cluster = self._new_cluster()\n",
        "                with self._lock:\n                    cluster = self._new_cluster()\n",
        (f"{T_CLUSTER_BUILD}::test_close_and_other_calls_never_wait_for_a_build_in_progress",),
    ),
    Mutation(
        "cluster-failed-build-forgotten",
        "a failed cluster client build is not tried again within remote_retry_interval",
        "lmcache_ec/remote/cluster_slots.py",
        "self._build_failed_until = time.monotonic() + self._retry_interval",
        "self._build_failed_until = time.monotonic()",
        (
            f"{T_CLUSTER_BUILD}::"
            "test_concurrent_calls_build_the_client_once_and_a_failed_build_waits_its_interval",
        ),
    ),
    Mutation(
        "cluster-late-build-published-after-close",
        "a cluster client built after close() is closed, never published",
        "lmcache_ec/remote/cluster_slots.py",
        (
            "            cluster, self._cluster = self._cluster, None\n"
            "            self._build = None\n"
        ),
        "            cluster, self._cluster = self._cluster, None\n",
        (f"{T_CLUSTER_BUILD}::test_close_and_other_calls_never_wait_for_a_build_in_progress",),
    ),
    # -- an unusable disk directory leaves its tier off: the engine starts, the CLI says so
    Mutation(
        "disk-dir-unusable-is-fatal",
        "an engine starts without a disk or node directory it cannot make or list",
        "lmcache_ec/tiers/frame_directory.py",
        "            with os.scandir(self.path):\n                pass  # opening it is the check",
        "            if False:\n                pass  # opening it is the check",
        (
            "tests/tiers/test_unusable_directory.py::"
            "test_the_engine_starts_without_a_disk_tier_it_cannot_use[a-file]",
        ),
    ),
    Mutation(
        "upstream-disk-replaces-ours",
        "with the disk tier off, LMCache's own disk backend does not take its place",
        "lmcache_ec/storage/manager.py",
        "            local_disk, self.config.local_disk = self.config.local_disk, None\n",
        "            local_disk = self.config.local_disk\n",
        (
            "tests/tiers/test_unusable_directory.py::"
            "test_the_engine_starts_without_a_disk_tier_it_cannot_use[a-file]",
        ),
    ),
    Mutation(
        "cli-unlistable-disk-traceback",
        "ls, stats and purge skip a directory they cannot list, with a warning and exit 1",
        "lmcache_ec/cli/entry_session.py",
        "            except OSError as exc:\n                self.skip(tier, exc)\n",
        "            except ImportError as exc:\n                self.skip(tier, exc)\n",
        (
            "tests/cli/test_unusable_inputs.py::"
            "test_an_unlistable_disk_directory_is_a_warning_and_exit_1[ls]",
        ),
    ),
    Mutation(
        "stats-bad-metrics-page-traceback",
        "stats --metrics-url on a page that is not Prometheus text exits 1 with a message",
        "lmcache_ec/cli/entries.py",
        "    except ValueError as exc:  # UnicodeDecodeError too\n",
        "    except KeyError as exc:\n",
        (
            "tests/cli/test_unusable_inputs.py::"
            "test_stats_reports_a_metrics_page_that_is_not_prometheus_text[html]",
        ),
    ),
    # -- the typed config: one predicate, one default, one conversion, one namespace
    Mutation(
        "shared-tier-leaves-out-the-node-tier",
        "the node tier is a shared tier: one tensor-parallel rank writes each item to it",
        CONFIG,
        "        return bool(self.local_disk) or self.node_tier or self.remote.configured\n",
        "        return bool(self.local_disk) or self.remote.configured\n",
        (
            f"{T_TYPED}::test_every_place_asking_for_a_shared_tier_agrees[node]",
            "tests/vllm/test_roles.py::"
            "test_one_tensor_parallel_rank_writes_each_item_to_the_node_tier",
        ),
    ),
    Mutation(
        "worker-decides-the-shared-tier-itself",
        "the vLLM worker asks the config's shared-tier predicate, not its own",
        "lmcache_ec/integration/vllm/worker.py",
        "        self.shared_tier = cache.config.shared_tier\n",
        "        self.shared_tier = bool(\n"
        "            cache.config.local_disk or cache.config.remote.configured)\n",
        (f"{T_TYPED}::test_every_place_asking_for_a_shared_tier_agrees[node]",),
    ),
    Mutation(
        "embedded-default-restates-a-size",
        "the embedded default takes every size from the schema (one default per key)",
        CONFIG,
        '    return {"local_disk": default_disk_dir()}\n',
        '    return {"local_disk": default_disk_dir(), "max_local_disk_size": 20.0}\n',
        (f"{T_TYPED}::test_the_embedded_default_takes_its_sizes_from_the_schema",),
    ),
    Mutation(
        "sizes-in-decimal-gigabytes",
        "a size of the config in GB is 1024**3 bytes, as LMCache reads its own",
        CONFIG_SCHEMA,
        "    return int(size_gb * GB)\n",
        "    return int(size_gb * 1000**3)\n",
        (f"{T_TYPED}::test_sizes_in_bytes_are_the_configured_gigabytes",),
    ),
    Mutation(
        "namespace-override-misses-the-node-tier",
        "an engine has one namespace: an override reaches the node tier's directory",
        "lmcache_ec/engine.py",
        "            config = replace(config, namespace=identity.namespace)\n",
        "            pass\n",
        (f"{T_TYPED}::test_a_namespace_override_is_the_node_tiers_namespace_too",),
    ),
    Mutation(
        "cpu-purge-ignores-weights",
        "a purge of one weights version keeps other versions' CPU entries",
        "lmcache_ec/purge/follow.py",
        "            if known and identity.weights != selector.weights:\n",
        "            if False:\n",
        (f"{T_PURGE}::test_a_purge_of_one_weights_version_keeps_the_others_cpu_entries",),
    ),
]

# Latency: the per-request timeline, promotions off the loading step, paired verdicts.
T_HIT_PATH = "tests/vllm/test_hit_path.py::"
T_SERVE_STATS = "tests/cli/test_bench_serve_stats.py::"
MUTATIONS += [
    Mutation(
        "promotion-left-to-the-timer",
        "a staged disk hit is promoted right after its answer, not in the step that loads it",
        "lmcache_ec/integration/vllm/worker.py",
        "                self._promote_before_the_step()\n",
        "                pass\n",
        (f"{T_HIT_PATH}test_a_staged_disk_hit_is_promoted_right_after_its_answer",),
    ),
    Mutation(
        "loading-instance-keeps-the-default-switch-interval",
        "a loading instance's threads take the GIL from vLLM's spinning waits within 0.5 ms",
        "lmcache_ec/integration/vllm/connector.py",
        "            self._switch_interval.lower()\n",
        "            pass\n",
        (f"{T_HIT_PATH}test_a_loading_instance_switches_threads_often_and_restores_it[ec_both]",),
    ),
    Mutation(
        "timeline-without-staged",
        "a hit's timeline records when every rank's staging answer was applied",
        WORKER_LINK,
        '            self.owner.mark(identifier, "staged")\n',
        "",
        (
            f"{T_HIT_PATH}test_a_lone_hit_records_its_way_in_order[v1]",
            f"{T_HIT_PATH}test_a_lone_hit_records_its_way_in_order[v2]",
        ),
    ),
    Mutation(
        "timeline-intervals-from-the-start",
        "a timeline interval runs between consecutive events, not from the first",
        "lmcache_ec/bench/serve_timeline.py",
        'return {f"{a}→{b}": events[b] - events[a] for a, b in itertools.pairwise(present)}',
        'return {f"{a}→{b}": events[b] - events["sent"] for a, b in itertools.pairwise(present)}',
        (f"{T_SERVE_STATS}test_timeline_lines_from_both_sides_join_into_intervals",),
    ),
    Mutation(
        "ratio-interval-one-rank-too-narrow",
        "the ratio's interval is the sign test's: at least 95 % coverage, not one rank less",
        "lmcache_ec/bench/paired.py",
        "        if below > tail:\n            break\n        k += 1",
        "        k += 1\n        if below > tail:\n            break",
        (
            f"{T_SERVE_STATS}test_order_statistic_rank_matches_the_sign_test_table[12-3]",
            f"{T_SERVE_STATS}test_ratio_interval_on_known_pairs",
        ),
    ),
    Mutation(
        "ratio-from-the-mean-of-pairs",
        "one pair that lands on a stall of the machine does not swing the ratio or its verdict",
        "lmcache_ec/bench/paired.py",
        "math.exp(statistics.median(logs)),",
        "math.exp(statistics.fmean(logs)),",
        (f"{T_SERVE_STATS}test_a_stalled_pair_does_not_swing_the_verdict",),
    ),
    Mutation(
        "straddling-interval-gets-a-verdict",
        "a verdict is given only when the interval is on one side of the target",
        "lmcache_ec/bench/paired.py",
        "        return Verdict.FAIL\n    return Verdict.INCONCLUSIVE\n",
        "        return Verdict.FAIL\n    return Verdict.FAIL\n",
        (
            f"{T_SERVE_STATS}test_verdict_only_when_the_interval_is_on_one_side",
            f"{T_SERVE_STATS}test_targets_inconclusive_when_the_interval_holds_the_target",
        ),
    ),
    Mutation(
        "purges-seen-not-exported",
        "a served engine's applied purges reach /metrics as vllm:lmcache_ec_purges_seen_total",
        "lmcache_ec/integration/vllm/stats.py",
        '    "purges_seen": (\n        "purges_seen",\n',
        '    "purges_seen_unused": (\n        "purges_seen_unused",\n',
        (f"{T_IDENTITY}test_stats_flow_into_vllm_logging_and_prometheus",),
    ),
    Mutation(
        "unanswered-lookup-not-asked-again",
        "one unanswered remote existence check is asked again before lookups pause",
        "lmcache_ec/integration/vllm/index.py",
        "                        answers = _ask_twice(catalog, names, self._closing)\n",
        "                        answers = catalog.lookup_many(names)\n",
        ("tests/vllm/test_index_ttl.py::test_one_unanswered_check_is_asked_again_not_paused",),
    ),
    Mutation(
        "lookup-pause-warning-without-its-cause",
        "the one warning that pauses remote lookups names the store's error",
        "lmcache_ec/integration/vllm/index.py",
        '    return catalog.last_error or "no answer"\n',
        '    return "no answer"\n',
        ("tests/vllm/test_scheduler_io.py::test_failing_remote_pauses_lookups_instead_of_queuing",),
    ),
    Mutation(
        "closed-index-check-retried-and-warned",
        "a check still in flight when the index closes ends quietly: no retry, no warning",
        "lmcache_ec/integration/vllm/index.py",
        "                if self._closing.is_set():\n                    break\n",
        "",
        (
            (
                "tests/vllm/test_index_ttl.py::test_a_closed_index_ends_its_check_without_re"
                "try_or_warning"
            ),
        ),
    ),
    # -- benchmark jobs: forked from the job server, with the caller's environment
    Mutation(
        "job-runs-with-the-servers-environment",
        "a forked job runs with the environment its caller gives it, not the server's",
        "lmcache_ec/bench/job_process.py",
        "    os.environ.clear()\n    os.environ.update(env)\n",
        "",
        (f"{T_BENCH_JOBS}test_each_job_is_a_new_process_with_the_environment_it_is_given",),
    ),
    Mutation(
        "job-killed-while-exiting",
        "a job that sent its answer is left to exit with its own status",
        "lmcache_ec/bench/job_protocol.py",
        "            process.join(max(1.0, deadline - time.monotonic()))  # it is exiting\n",
        "",
        (f"{T_BENCH_JOBS}test_a_job_still_exiting_after_its_pipe_closed_keeps_its_own_status",),
    ),
    Mutation(
        "ended-request-records-kept",
        (
            "a lookup or claim asked about for requests that all ended leaves the item "
            "table at its answer or deadline"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "        if self.waits.needs(identifier):\n",
        "        if True:\n",
        (
            (
                "tests/vllm/test_item_lifecycle.py::test_the_records_of_claims_waited_on_by_"
                "ended_requests_leave_at_their_deadline"
            ),
            (
                "tests/vllm/test_item_lifecycle.py::test_the_record_of_a_lookup_whose_reques"
                "t_ended_leaves_at_its_answer"
            ),
        ),
    ),
    Mutation(
        "failed-record-kept-past-retry",
        "a failed fetch's record leaves the item table at its retry time",
        "lmcache_ec/integration/vllm/scheduler.py",
        (
            "            elif state is S.FAILED:  # its retry time: the record says "
            "nothing any more\n"
            "                self.items.allow_retry(identifier)\n"
        ),
        "",
        (
            (
                "tests/vllm/test_item_lifecycle.py::test_a_staging_no_request_waits_for_give"
                "s_its_slot_back_at_its_deadline"
            ),
        ),
    ),
    Mutation(
        "put-failure-logged-per-save",
        "a save whose put raises every time is counted each time and logged once per kind",
        "lmcache_ec/integration/vllm/saver.py",
        "        if kind not in self._failures_logged:\n",
        "        if True:\n",
        (
            (
                "tests/vllm/test_saver_failures.py::test_a_put_that_raises_at_every_save_is_"
                "logged_once_and_counted_each_time"
            ),
        ),
    ),
    Mutation(
        "feature-off-summed-per-front-end",
        (
            "a feature off reaches vLLM's front-ends as its level, right in whichever "
            "front-end gets the step"
        ),
        "lmcache_ec/integration/vllm/features_off.py",
        "                self._levels[name] = stats[name] = level\n",
        "                self._levels[name] = level\n",
        (
            (
                "tests/vllm/test_identity_plugin_stats.py::test_a_feature_off_is_shown_right"
                "_by_whichever_front_end_gets_its_step"
            ),
        ),
    ),
    Mutation(
        "feature-back-on-dropped-as-empty",
        "a feature back on everywhere is reported (its level 0), not dropped as empty stats",
        "lmcache_ec/integration/vllm/stats.py",
        "        return not any(value or is_off_key(name) for name, value in self.data.items())\n",
        "        return not any(self.data.values())\n",
        (
            (
                "tests/vllm/test_identity_plugin_stats.py::test_a_feature_off_is_shown_right"
                "_by_whichever_front_end_gets_its_step"
            ),
        ),
    ),
    Mutation(
        "negative-counter-raised-into-vllm",
        "a negative counter value is not counted, never raised into vLLM's output handler",
        "lmcache_ec/integration/vllm/stats.py",
        "            if value > 0:  # prometheus raises on a negative increment\n",
        "            if value:\n",
        (
            (
                "tests/vllm/test_identity_plugin_stats.py::test_stats_flow_into_vllm_logging"
                "_and_prometheus"
            ),
        ),
    ),
    Mutation(
        "counter-undocumented",
        "every counter of the vLLM connector is named in docs/vllm.md",
        "docs/vllm.md",
        "`purges_seen`, `weights_changes`, `fingerprint_seconds` (time fingerprinting\n",
        "`purges_seen`, `weights_changes`, (time fingerprinting\n",
        ("tests/test_docs.py::test_every_counter_of_the_vllm_connector_is_documented",),
    ),
    Mutation(
        "runtime-dir-token-never-replaced",
        "a runtime-dir token whose name another user took gives way to a fresh one",
        "lmcache_ec/runtime_dirs.py",
        "                    token = None\n",
        "                    break\n",
        (
            (
                "tests/test_runtime_dirs.py::test_a_token_whose_name_another_user_took_is_re"
                "placed_and_found_by_later_processes"
            ),
            (
                "tests/test_runtime_dirs.py::test_processes_replacing_a_taken_token_at_once_"
                "agree_on_one_directory"
            ),
        ),
    ),
    Mutation(
        "runtime-dir-earlier-token-dir-ignored",
        "a token replaced on another node leaves this node's processes in their directory",
        "lmcache_ec/runtime_dirs.py",
        (
            "        if earlier and _is_private(os.path.join(base, name)):\n"
            "            return os.path.join(base, name)\n"
        ),
        "",
        (
            (
                "tests/test_runtime_dirs.py::test_a_token_replaced_on_another_node_leaves_th"
                "is_nodes_processes_in_their_directory"
            ),
        ),
    ),
    Mutation(
        "purge-selects-by-slug-alone",
        "a purge or listing by namespace/model confirms the exact names from each entry's header",
        "lmcache_ec/purge/selection.py",
        "        if not self.matches_identity(entry):\n            return False\n",
        "",
        (
            (
                "tests/purge/test_selection_exact.py::test_purging_a_namespace_leaves_anothe"
                "r_whose_slug_is_the_same"
            ),
            (
                "tests/purge/test_selection_exact.py::test_purging_and_listing_a_model_leave"
                "_another_whose_slug_is_the_same"
            ),
            (
                "tests/purge/test_selection_exact.py::test_an_engine_applying_a_purge_leaves"
                "_its_model_whose_slug_is_the_purged_one"
            ),
        ),
    ),
    Mutation(
        "purge-by-name-reads-no-headers",
        "the CLI reads headers for a purge by namespace/model",
        "lmcache_ec/purge/selection.py",
        (
            "            self.namespace is not None  # a slug names a namespace only up to "
            "its tag\n"
            "            or self.model is not None\n"
        ),
        "            False\n",
        (
            (
                "tests/purge/test_selection_exact.py::test_purging_a_namespace_leaves_anothe"
                "r_whose_slug_is_the_same"
            ),
            (
                "tests/purge/test_selection_exact.py::test_purging_and_listing_a_model_leave"
                "_another_whose_slug_is_the_same"
            ),
        ),
    ),
    Mutation(
        "purge-trusts-unproven-header",
        "a header that does not hash to its entry's name cannot shield the entry from a purge",
        "lmcache_ec/purge/selection.py",
        "    return identity if proven else None\n",
        "    return identity\n",
        (
            (
                "tests/purge/test_selection_exact.py::test_entries_whose_headers_prove_nothi"
                "ng_are_purged_by_their_names"
            ),
        ),
    ),
    Mutation(
        "node-dir-made-again-loses-its-users",
        "a node directory made again under running processes keeps their entries",
        "lmcache_ec/tiers/node.py",
        "        self._users.rejoin()  # a fresh ``.users``: without it, the next joiner clears\n",
        "",
        ("tests/tiers/test_node_tier.py::test_a_node_directory_made_again_keeps_its_users",),
    ),
    Mutation(
        "node-dir-made-again-by-another-not-joined",
        "a node-tier user joins a directory another process made again at its next write",
        "lmcache_ec/tiers/node.py",
        "        if not self._users.current():  # another process made the directory again\n",
        "        if False:\n",
        (
            (
                "tests/tiers/test_node_tier.py::test_a_user_joins_a_directory_another_made_a"
                "gain_at_its_next_write"
            ),
        ),
    ),
    Mutation(
        "node-users-lock-unbounded",
        "an engine starts (without the node tier) while a stopped process holds .users",
        "lmcache_ec/tiers/node.py",
        "            flock_within(self._fd, USERS_LOCK_WAIT_S, self._path, shared=True)\n",
        "            fcntl.flock(self._fd, fcntl.LOCK_SH)\n",
        (
            (
                "tests/tiers/test_node_tier.py::test_an_engine_starts_without_the_node_tier_"
                "while_a_stopped_process_holds_it"
            ),
        ),
    ),
    Mutation(
        "entry-open-waits-on-a-fifo",
        "a FIFO (or a symlink to one) under an entry name is a miss, never a hang",
        "lmcache_ec/tiers/disk_layout.py",
        "ENTRY_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC\n",
        "ENTRY_OPEN = os.O_RDONLY | os.O_CLOEXEC\n",
        (
            (
                "tests/tiers/test_entry_faults.py::test_a_fifo_under_an_entry_name_is_a_miss"
                "_not_a_hang[fifo]"
            ),
            (
                "tests/tiers/test_entry_faults.py::test_a_fifo_under_an_entry_name_is_a_miss"
                "_not_a_hang[symlink-to-fifo]"
            ),
        ),
    ),
    Mutation(
        "oversized-entry-read-whole",
        "a file larger than its tier is a miss before anything is read or allocated",
        "lmcache_ec/tiers/frame_directory.py",
        "        if self._too_large(path, info.st_size):\n",
        "        if False:\n",
        (
            (
                "tests/tiers/test_entry_faults.py::test_a_file_larger_than_the_tier_is_a_mis"
                "s_before_anything_is_read"
            ),
        ),
    ),
    Mutation(
        "unreadable-entry-kept",
        "an entry this process cannot read is removed, so the next put writes it again",
        "lmcache_ec/tiers/frame_directory.py",
        (
            "        elif isinstance(exc, PermissionError):  # another user's file, in a "
            "directory of ours\n"
            '            self._unservable(key, path, f"not readable by this process '
            '({exc.strerror})")\n'
        ),
        "",
        (
            (
                "tests/tiers/test_entry_faults.py::test_an_entry_this_process_cannot_read_is"
                "_removed_and_written_again"
            ),
        ),
    ),
    Mutation(
        "damaged-entry-logged-per-read",
        "failed reads and damaged entries log one line per episode, not per read",
        "lmcache_ec/tiers/frame_directory.py",
        "        if self._reads_ok:\n",
        "        if True:\n",
        (
            (
                "tests/tiers/test_entry_faults.py::test_a_damaged_entry_that_cannot_be_remov"
                "ed_is_logged_once_an_episode"
            ),
        ),
    ),
    Mutation(
        "failed-write-logged-per-write",
        "failed writes log one line per episode, not per write",
        "lmcache_ec/tiers/frame_directory.py",
        (
            "            if self._last_write_ok:  # one line per episode, not per write (a "
            "full disk)\n"
        ),
        "            if True:\n",
        (
            (
                "tests/tiers/test_entry_faults.py::test_a_full_disk_logs_one_line_per_episod"
                "e_not_per_write"
            ),
        ),
    ),
    Mutation(
        "ledger-write-failure-keeps-its-temp",
        "a reservation whose ledger write fails leaves no temp file for scans to count",
        "lmcache_ec/tiers/budget.py",
        "                    os.remove(temp)\n",
        "                    pass\n",
        (
            (
                "tests/tiers/test_full_node_dir_ledger.py::test_a_shared_ledger_failing_at_a_wr"
                "ite_costs_that_write_only"
            ),
        ),
    ),
    Mutation(
        "temp-of-pid-0-or-1-is-live",
        "a temp file named for pid 0 or 1 is no live write: reclaimed, not counted",
        "lmcache_ec/tiers/disk_layout.py",
        (
            "    if pid <= 1 and pid != os.getpid():\n"
            "        return False  # kill(0) reaches our own group, and init never dies: "
            "says nothing\n"
        ),
        "",
        (
            (
                "tests/tiers/test_budget_faults.py::test_a_temp_file_of_pid_0_or_1_is_reclai"
                "med_not_counted[pid-0]"
            ),
            (
                "tests/tiers/test_budget_faults.py::test_a_temp_file_of_pid_0_or_1_is_reclai"
                "med_not_counted[pid-1]"
            ),
        ),
    ),
    Mutation(
        "temp-reservation-unbounded",
        "a temp name reserving more than the limit counts at its own size, evicting nothing",
        "lmcache_ec/tiers/disk_layout.py",
        (
            "                    if max_reserved is not None and reserved > max_reserved:\n"
            "                        reserved = 0\n"
        ),
        "",
        (
            (
                "tests/tiers/test_budget_faults.py::test_a_temp_name_reserving_more_than_the"
                "_limit_evicts_nothing"
            ),
        ),
    ),
    Mutation(
        "temp-staleness-by-mtime",
        "a temp file with a future mtime still goes stale (its ctime bounds it)",
        "lmcache_ec/tiers/disk_layout.py",
        "    return now - min(stat.st_mtime, stat.st_ctime) > STALE_TEMP_SECONDS\n",
        "    return now - stat.st_mtime > STALE_TEMP_SECONDS\n",
        (
            (
                "tests/tiers/test_budget_faults.py::test_a_temp_file_with_a_future_mtime_sti"
                "ll_goes_stale"
            ),
        ),
    ),
    Mutation(
        "ledger-kept-after-directory-made-again",
        "every process sharing a path follows the directory made again to its new ledger",
        "lmcache_ec/tiers/budget.py",
        "        if self._ledger is None or directory != self._ledger_of:\n",
        "        if self._ledger is None:\n",
        (
            (
                "tests/tiers/test_budget_faults.py::test_a_directory_made_again_moves_every_"
                "process_to_its_new_ledger"
            ),
        ),
    ),
    Mutation(
        "header-read-blocks-on-a-fifo",
        "a FIFO (or a symlink to one) under an entry name is damage to purge and ls, never a hang",
        "lmcache_ec/tiers/disk_layout.py",
        '    with open(open_entry(path)[0], "rb") as stream:\n',
        '    with open(path, "rb") as stream:\n',
        (
            (
                "tests/tiers/test_budget_faults.py::test_a_fifo_under_an_entry_name_is_damag"
                "ed_not_a_hang[fifo]"
            ),
            (
                "tests/tiers/test_budget_faults.py::test_a_fifo_under_an_entry_name_is_damag"
                "ed_not_a_hang[symlink-to-fifo]"
            ),
        ),
    ),
    Mutation(
        "close-waits-close-timeout-twice",
        "close() returns within close_timeout: the flush and the tiers' stop share it",
        "lmcache_ec/engine.py",
        "        closer.join(timeout=max(deadline - time.monotonic(), 0.0))\n",
        "        closer.join(timeout=max(self.config.close_timeout, 1.0))\n",
        (
            (
                "tests/test_engine.py::test_close_is_bounded_by_close_timeout_when_writes_an"
                "d_the_stop_both_wait"
            ),
        ),
    ),
    Mutation(
        "pool-full-logged-per-put",
        "a full CPU pool: put_rejected per put, one log line per episode",
        "lmcache_ec/engine.py",
        "        if not self._pool_was_full:\n",
        "        if True:\n",
        (
            (
                "tests/test_engine.py::test_a_full_cpu_pool_is_logged_once_per_episode_and_c"
                "ounted_per_put"
            ),
        ),
    ),
    Mutation(
        "weights-fingerprint-of-nothing",
        (
            "a language model holding every tensor (Transformers backend) never empties "
            "the weights fingerprint"
        ),
        "lmcache_ec/integration/vllm/weights.py",
        "    if kept or not named:\n",
        "    if True:\n",
        (
            (
                "tests/vllm/test_weights.py::test_a_vision_update_under_the_transformers_bac"
                "kend_changes_the_fingerprint"
            ),
            (
                "tests/vllm/test_weights.py::test_a_language_model_holding_every_weight_fing"
                "erprints_them_all"
            ),
        ),
    ),
    Mutation(
        "identity-without-video-pruning",
        "--video-pruning-rate is part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        '    "video_pruning_rate",\n',
        "",
        (
            (
                "tests/vllm/test_identity_inputs.py::test_video_pruning_given_as_vllm_takes_"
                "it_changes_the_fingerprint"
            ),
            (
                "tests/vllm/test_identity_inputs.py::test_a_multimodal_setting_that_changes_"
                "encoder_outputs_changes_the_fingerprint[video_pruning_rate-0.5]"
            ),
        ),
    ),
    Mutation(
        "identity-hf-config-allow-list",
        "every encoder setting of the HF config, of any name, is part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        "        kept[key] = value\n",
        (
            "        if "
            're.search(r"vision|visual|audio|image|video|projector|mm_|qformer", key):\n'
            "            kept[key] = value\n"
        ),
        (
            (
                "tests/vllm/test_identity_inputs.py::test_an_hf_override_of_an_encoder_setti"
                "ng_of_any_name_changes_the_fingerprint[override0]"
            ),
        ),
    ),
    Mutation(
        "identity-with-loader-dtype",
        (
            "the HF config's dtype, which the Transformers backend rewrites as it loads, "
            "is not part of the encoder identity"
        ),
        "lmcache_ec/integration/vllm/identity.py",
        (
            '_NOT_ENCODER_KEYS = frozenset({"_name_or_path", "transformers_version", '
            '"dtype", "torch_dtype"})\n'
        ),
        '_NOT_ENCODER_KEYS = frozenset({"_name_or_path", "transformers_version"})\n',
        (
            (
                "tests/vllm/test_identity_inputs.py::test_text_config_edits_and_the_loaders_"
                "dtype_rewrite_keep_the_fingerprint"
            ),
        ),
    ),
    Mutation(
        "identity-without-processor-files",
        "the processor config files are part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        '        "processor_files": processor_files(model_config),\n',
        "",
        (
            (
                "tests/vllm/test_identity_inputs.py::test_an_edited_processor_config_changes"
                "_the_fingerprint"
            ),
            (
                "tests/vllm/test_identity_inputs.py::test_a_hub_models_processor_config_is_r"
                "ead_from_its_snapshot"
            ),
        ),
    ),
    Mutation(
        "tower-lora-ids-persisted",
        "a tower-LoRA identifier (an adapter name, not content) is not persisted by default",
        "lmcache_ec/integration/vllm/identity.py",
        '_CONTENT_ID = re.compile(r"^(?:[0-9a-f]{64}|[0-9a-f]{128})$")\n',
        '_CONTENT_ID = re.compile(r"^(?:[^:]{1,256}:)?(?:[0-9a-f]{64}|[0-9a-f]{128})$")\n',
        (
            (
                "tests/vllm/test_identity_inputs.py::test_two_adapters_under_one_name_share_"
                "vllms_identifier_and_it_is_not_persisted"
            ),
            (
                "tests/vllm/test_identity_inputs.py::test_an_item_under_a_tower_lora_is_comp"
                "uted_and_never_saved"
            ),
            "tests/vllm/test_identity_plugin_stats.py::test_identifier_policy",
        ),
    ),
    Mutation(
        "corrupt-drop-logged-per-read",
        "a damaged entry that cannot be removed is a counted miss at every read, logged once",
        "lmcache_ec/storage/reads.py",
        "        if self._first_drop(key, tier):\n",
        "        if True:\n",
        ("tests/faults/test_disk_faults.py::test_read_only_directory",),
    ),
    Mutation(
        "stale-stage-answer-taken",
        "an answer to a stage order given up never moves the item's next order",
        "lmcache_ec/integration/vllm/worker_link.py",
        (
            "        if not self.answers(identifier, order, direct=direct):\n"
            "            return  # an order given up: the copy it staged is released, or will be\n"
        ),
        "",
        (
            (
                "tests/vllm/test_stage_answers.py::test_the_answer_to_an_order_given_up_is_n"
                "ot_taken_for_the_next_order[1]"
            ),
            (
                "tests/vllm/test_stage_answers.py::test_the_answer_to_an_order_given_up_is_n"
                "ot_taken_for_the_next_order[2]"
            ),
            (
                "tests/vllm/test_stage_answers.py::test_a_late_step_report_is_not_taken_for_"
                "the_next_order"
            ),
        ),
    ),
    Mutation(
        "stage-answer-unnumbered",
        "a worker's stage answer names the order it answers",
        "lmcache_ec/integration/vllm/worker.py",
        "            link.send(StageAnswer(tuple(staged), tuple(failed), weights, order.number))\n",
        "            link.answer(staged, failed, weights)\n",
        (
            (
                "tests/vllm/test_stage_answers.py::test_the_answer_to_an_order_given_up_is_n"
                "ot_taken_for_the_next_order[1]"
            ),
            (
                "tests/vllm/test_stage_answers.py::test_the_answer_to_an_order_given_up_is_n"
                "ot_taken_for_the_next_order[2]"
            ),
        ),
    ),
    Mutation(
        "stale-generation-answers-failed",
        "a read across a weights change answers nothing and leaves the new order to stage",
        "lmcache_ec/integration/vllm/worker.py",
        (
            "                # same item under the new weights) is not theirs to answer.\n"
            "                return\n"
        ),
        (
            "                # same item under the new weights) is not theirs to answer.\n"
            "                tensors = [None] * len(identifiers)\n"
        ),
        (
            (
                "tests/vllm/test_stage_answers.py::test_a_read_across_an_unchanged_weights_s"
                "ession_leaves_the_new_order_to_stage"
            ),
        ),
    ),
    Mutation(
        "negative-counter-accepted",
        "a worker report with a counter below zero is a bad frame",
        "lmcache_ec/integration/vllm/stage_messages.py",
        '            and (number >= 0 or key.startswith(f"{FEATURE_OFF}:"))\n',
        "",
        (
            (
                "tests/vllm/test_stage_answers.py::test_a_counter_below_zero_is_a_bad_frame_"
                "and_a_feature_back_on_is_not"
            ),
            (
                "tests/vllm/test_stage_answers.py::test_a_report_with_a_counter_below_zero_b"
                "reaks_the_channel_not_the_step"
            ),
        ),
    ),
    Mutation(
        "stage-deadline-restarts-at-dispatch",
        "stage_timeout_s counts from queueing",
        "lmcache_ec/integration/vllm/worker_link.py",
        "        for identifier, deadline in started:\n",
        (
            "        for identifier, _ in started:\n"
            "            deadline = time.monotonic() + self.settings.stage_timeout_s\n"
        ),
        ("tests/vllm/test_stage_answers.py::test_the_stage_timeout_counts_from_queueing",),
    ),
    Mutation(
        "channel-break-fails-fetches",
        "a stage channel break fails no request and holds no item off the tiers",
        "lmcache_ec/integration/vllm/worker_link.py",
        (
            '                        identifier, now, "the stage channel broke", '
            "fetch_failed=False\n"
        ),
        '                        identifier, now, "the stage channel broke"\n',
        (
            (
                "tests/vllm/test_stage_answers.py::test_a_broken_channel_fails_no_request_an"
                "d_holds_no_item_off_the_tiers"
            ),
        ),
    ),
    Mutation(
        "stage-receive-unbounded",
        "one receive reads a bounded share of a flooding peer, losing nothing",
        "lmcache_ec/integration/vllm/stage_client.py",
        (
            "                        rank.sock, now, max_bytes=_RECEIVE_BYTES, "
            "max_frames=_RECEIVE_FRAMES\n"
        ),
        "                        rank.sock, now\n",
        (
            (
                "tests/vllm/test_stage_answers.py::test_a_flood_is_read_a_bounded_share_per_"
                "receive_and_none_of_it_lost"
            ),
        ),
    ),
    Mutation(
        "one-down-shard-pauses-every-lookup",
        (
            "with one cluster shard down, the scheduler's index still finds the items the "
            "other shards hold, and pauses no lookup"
        ),
        "lmcache_ec/integration/vllm/index.py",
        "                        failed = bool(catalog.last_error)\n",
        "                        failed = any(present is None for present in answers)\n",
        (
            (
                "tests/cluster/test_cluster_index.py::test_one_shard_down_leaves_the_other_s"
                "hards_items_found"
            ),
        ),
    ),
    Mutation(
        "s3-range-ignored-read-whole",
        (
            "an S3-compatible server that ignores Range is read only as far as the range "
            "asked, from the right offset"
        ),
        "lmcache_ec/remote/s3_store.py",
        "            data = body.read(start + length if whole else length)\n",
        "            data = body.read()\n",
        (
            (
                "tests/remote/test_catalog.py::test_a_server_ignoring_range_is_read_only_as_"
                "far_as_asked"
            ),
        ),
    ),
    Mutation(
        "redis-integer-range-made-zeros",
        "a Redis range read answered with an integer reads as nothing, not that many zero bytes",
        "lmcache_ec/remote/redis_store.py",
        '    return reply if isinstance(reply, bytes) else b""\n',
        "    return bytes(reply)\n",
        ("tests/remote/test_catalog.py::test_a_range_answered_with_an_integer_reads_as_nothing",),
    ),
    Mutation(
        "streaming-chunk-items-not-looked-up",
        "a streaming session's later chunk loads its items from the tiers like the first chunk's",
        "lmcache_ec/integration/vllm/request_waits.py",
        (
            "        if count != len(request.mm_features):  # new, or a streaming "
            "session's next chunk\n"
        ),
        "        if count == -1:\n",
        (
            (
                "tests/vllm/test_streaming_sessions.py::test_an_item_of_a_later_chunk_is_loa"
                "ded_not_encoded"
            ),
        ),
    ),
    Mutation(
        "consumer-fetch-held-off-after-abort",
        (
            "an ec_consumer fetches an item again with the next request after a fetch "
            "given up with no request waiting"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "            if fetch_failed and self.is_producer:\n",
        "            if fetch_failed:\n",
        (
            (
                "tests/vllm/test_consumer_retry.py::test_a_fetch_given_up_after_its_request_"
                "ended_is_fetched_by_the_next"
            ),
        ),
    ),
    Mutation(
        "claim-released-under-the-new-weights",
        (
            "a weights change withdraws the claims made under the old weights, by the "
            "names they were made under"
        ),
        "lmcache_ec/integration/vllm/encode_claims.py",
        "            self.agent.release(held[1])\n",
        "            self.agent.release(self.index.storage_name(identifier))\n",
        (
            (
                "tests/vllm/test_claim_release.py::test_a_weights_change_withdraws_the_claim"
                "s_made_under_the_old_weights"
            ),
        ),
    ),
    Mutation(
        "vllm-claim-released-before-the-write-lands",
        (
            "a vLLM worker reports a save (which withdraws its claim) only once the output "
            "reached the shared tier"
        ),
        "lmcache_ec/integration/vllm/worker.py",
        "        writing = key is not None and self.cache.writing_below(key)\n",
        "        writing = False\n",
        (
            (
                "tests/vllm/test_claim_release.py::test_a_claim_holds_until_the_output_reach"
                "ed_the_shared_tier"
            ),
        ),
    ),
    Mutation(
        "vllm-save-report-held-past-claim-wait",
        "a save whose shared write still runs after claim_wait_s is reported anyway",
        "lmcache_ec/integration/vllm/worker.py",
        "            if now >= entry[2] or not self.cache.writing_below(entry[1])\n",
        "            if not self.cache.writing_below(entry[1])\n",
        (
            (
                "tests/vllm/test_claim_release.py::test_a_save_whose_shared_write_hangs_is_r"
                "eported_after_claim_wait_s"
            ),
        ),
    ),
    Mutation(
        "staging-kept-after-its-late-request-ends",
        (
            "a staging past its deadline whose request ends before looking again is given "
            "up with its slot in flight"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "            if item and item.state in (S.QUEUED, S.STAGING) and now >= item.deadline:\n",
        "            if False:\n",
        (
            (
                "tests/vllm/test_item_lifecycle.py::test_a_staging_whose_request_ends_after_"
                "its_deadline_gives_its_slot_back"
            ),
        ),
    ),
    Mutation(
        "claim-files-opened-blocking-and-following-links",
        "a FIFO or symlink named like a claim is garbage, never a hang of the claims thread",
        "lmcache_ec/claims.py",
        "_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC\n",
        "_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC\n",
        (
            "tests/test_claim_files.py::test_a_fifo_named_like_a_claim_is_taken_over_not_waited_on",
            (
                "tests/test_claim_files.py::test_a_symlink_named_like_a_claim_is_garbage_and"
                "_its_target_untouched"
            ),
            "tests/test_claim_files.py::test_a_release_leaves_a_fifo_alone_at_once",
            (
                "tests/test_claim_files.py::test_the_sweep_removes_fifos_symlinks_and_socket"
                "s_named_like_claims"
            ),
        ),
    ),
    Mutation(
        "group-claims-directory-private",
        "users of a group sharing the disk tier share its claims",
        "lmcache_ec/claims.py",
        "        _make_directory(directory, 0o2770 if group_shared else 0o700)\n",
        "        _make_directory(directory, 0o700)\n",
        ("tests/test_claim_files.py::test_users_of_a_group_share_claims",),
    ),
    Mutation(
        "group-claim-files-private",
        "users of a group sharing the disk tier share its claim files",
        "lmcache_ec/claims.py",
        "        self._file_mode = 0o660 if group_shared else 0o600\n",
        "        self._file_mode = 0o600\n",
        ("tests/test_claim_files.py::test_users_of_a_group_share_claims",),
    ),
    Mutation(
        "group-claims-not-configured",
        "the cache builds its claims with the disk tier's group sharing",
        "lmcache_ec/storage/single_flight.py",
        (
            "        return open_directory_claims(disk, config.local_disk_group_shared) if disk e"
            "lse None\n"
        ),
        "        return open_directory_claims(disk, False) if disk else None\n",
        (
            (
                "tests/test_claim_files.py::test_the_caches_claims_follow_the_disk_tiers_gro"
                "up_sharing[True]"
            ),
        ),
    ),
    Mutation(
        "claims-denied-silently",
        "claims a user cannot make are one warning, not silence",
        "lmcache_ec/claims.py",
        (
            "        except PermissionError as exc:\n"
            "            self._warn_once(exc)\n"
            "            return True\n"
        ),
        "",
        (
            (
                "tests/test_claim_files.py::test_claims_another_user_cannot_make_are_one_war"
                "ning_not_one_per_claim"
            ),
        ),
    ),
    Mutation(
        "waiters-stampede-after-a-takeover",
        "waiters whose holder failed wait for the one that took its claim over",
        "lmcache_ec/storage/get_or_compute.py",
        (
            "                    deadlines[mm_hash] = now + rule.bound_s\n"
            "                    turn = Turn.WAIT\n"
        ),
        "",
        (
            (
                "tests/test_get_or_compute.py::test_waiters_whose_holder_failed_wait_for_the"
                "_one_that_took_its_claim_over[claim-expires-directory]"
            ),
        ),
    ),
    Mutation(
        "waiter-extends-for-ever",
        "a wait stays bounded (twice wait_s) even on a claim renewed for ever",
        "lmcache_ec/storage/get_or_compute.py",
        "                    extended.add(mm_hash)  # once: a wait stays bounded\n",
        "",
        (
            (
                "tests/test_get_or_compute.py::test_a_claim_renewed_for_ever_delays_a_waiter"
                "_at_most_twice_its_bound"
            ),
        ),
    ),
    Mutation(
        "cpu-tier-feeds-lmcache-chunk-statistics",
        "puts and promotions leave LMCache's KV-chunk statistics flat (no growth per put)",
        "lmcache_ec/tiers/local_cpu.py",
        (
            "        self.cache_policy = _without_statistics(self.cache_policy)  # "
            "hot_cache is still empty\n"
        ),
        "",
        (
            (
                "tests/storage/test_engine_limits.py::test_puts_and_promotions_leave_lmcache"
                "s_chunk_statistics_flat"
            ),
        ),
    ),
    Mutation(
        "pool-full-warning-per-put",
        "a put that evicts to make room logs no allocation failure",
        "lmcache_ec/storage/manager.py",
        'logging.getLogger("lmcache.v1.memory_management").addFilter(_PoolFullFilter())\n',
        "",
        (
            (
                "tests/storage/test_engine_limits.py::test_puts_that_evict_to_make_room_log_"
                "no_allocation_failure"
            ),
        ),
    ),
    Mutation(
        "pool-full-filter-hides-lmcache-pools",
        "LMCache's own pools (a KV cache in the process) keep their allocation warnings",
        "lmcache_ec/storage/manager.py",
        (
            '            allocating_from_pool() and "because no memory is available" in '
            "record.getMessage()\n"
        ),
        '            "because no memory is available" in record.getMessage()\n',
        ("tests/storage/test_engine_limits.py::test_lmcaches_own_pools_still_warn_when_full",),
    ),
    Mutation(
        "remove-undone-by-a-read-in-flight",
        "remove is not undone by a read that fetched the entry before it",
        "lmcache_ec/storage/reads.py",
        (
            "        self.purge_begins()\n"
            "        try:\n"
            "            return self._storage.remove(key) > 0\n"
            "        finally:\n"
            "            self.purge_ends()\n"
        ),
        "        return self._storage.remove(key) > 0\n",
        (
            (
                "tests/storage/test_engine_limits.py::test_remove_during_a_remote_read_is_no"
                "t_undone_by_its_promotion"
            ),
        ),
    ),
    Mutation(
        "cpu-pool-not-whole-allocation-units",
        "a frame larger than cpu_capacity once rounded is a ValueError that evicts nothing",
        "lmcache_ec/tiers/allocator.py",
        (
            "        buffer = host_buffer(size // align * align, pinned)\n"
            "        self.buffer = buffer[: buffer.numel() // align * align]  # its halves "
            "are too\n"
        ),
        "        self.buffer = host_buffer(size, pinned)\n",
        (
            (
                "tests/storage/test_engine_limits.py::test_a_frame_larger_than_the_pool_once"
                "_rounded_is_refused_and_evicts_nothing"
            ),
        ),
    ),
    Mutation(
        "compute-results-checked-against-the-current-identity",
        "get_or_compute checks compute's results against the identity the call started with",
        GET_OR_COMPUTE,
        "            return checked_results(hashes, tensors, identity, self._check_fits)\n",
        (
            "            return checked_results(hashes, tensors, self._cache.identity, "
            "self._check_fits)\n"
        ),
        (
            (
                "tests/storage/test_engine_limits.py::test_a_result_of_the_calls_dtype_is_re"
                "turned_across_set_identity"
            ),
            (
                "tests/storage/test_engine_limits.py::test_a_result_of_the_new_identitys_dty"
                "pe_is_refused_for_a_call_begun_before"
            ),
        ),
    ),
    Mutation(
        "storage-name-accepts-a-trailing-newline",
        "a storage name is one line: a trailing newline makes it none",
        "lmcache_ec/key.py",
        ('    r"\\.(?P<digest>[0-9a-f]{64})\\Z"  # \\Z: "$" also matches before a final newline\n'),
        '    r"\\.(?P<digest>[0-9a-f]{64})$"\n',
        (
            (
                "tests/storage/test_engine_limits.py::test_a_storage_name_with_a_trailing_ne"
                "wline_is_none"
            ),
        ),
    ),
    Mutation(
        "followers-share-the-leaders-graph",
        "followers of a get_or_compute get tensors outside the leader's autograd graph",
        "lmcache_ec/storage/get_or_compute.py",
        (
            "            self._flights.land(name, flight, results.get(mm_hash), "
            "share=_detached_copy)\n"
        ),
        ("            self._flights.land(name, flight, results.get(mm_hash), share=torch.clone)\n"),
        (
            (
                "tests/test_get_or_compute.py::test_followers_get_tensors_outside_the_leader"
                "s_autograd_graph"
            ),
        ),
    ),
    Mutation(
        "one-string-read-as-hashes",
        "get_or_compute_many refuses one string for its hashes (not one hash per character)",
        "lmcache_ec/engine.py",
        (
            "        if isinstance(mm_hashes, (str, bytes)):  # would be read as one hash "
            "per character\n"
        ),
        "        if False:\n",
        ("tests/test_get_or_compute.py::test_bad_arguments_are_refused",),
    ),
    Mutation(
        "cluster-redirect-unrecognised",
        "a key whose slot moved or is moving is answered where it went, never an outage",
        "lmcache_ec/remote/redis_cluster.py",
        "    return next((reply for reply in replies if isinstance(reply, AskError)), None)\n",
        "    return None\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_key_whose_slot_moved_is_read"
                "_and_written_at_its_new_primary"
            ),
            (
                "tests/cluster/test_cluster_topology.py::test_a_key_of_a_slot_being_moved_is"
                "_asked_for_where_it_went"
            ),
        ),
    ),
    Mutation(
        "cluster-ask-without-asking",
        "a key of a slot being moved is read and written on the importing node",
        "lmcache_ec/remote/redis_cluster.py",
        "        return ClusterNode(redirect.host, redirect.port), not moved\n",
        "        return ClusterNode(redirect.host, redirect.port), False\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_key_of_a_slot_being_moved_is"
                "_asked_for_where_it_went"
            ),
        ),
    ),
    Mutation(
        "cluster-moved-map-kept",
        "after MOVED the slot map is asked for again",
        "lmcache_ec/remote/redis_cluster.py",
        "            self._slots.refresh_soon()  # the slot has another owner: the map is stale\n",
        "            pass\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_key_whose_slot_moved_is_read"
                "_and_written_at_its_new_primary"
            ),
        ),
    ),
    Mutation(
        "cluster-failed-shard-map-kept",
        "after a failover the shard's keys are served by its new primary without a restart",
        "lmcache_ec/remote/redis_cluster.py",
        "        self._slots.refresh_soon()  # a replica may take over its slots\n",
        "",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_after_a_failover_the_shards_ke"
                "ys_are_served_by_its_new_primary"
            ),
        ),
    ),
    Mutation(
        "cluster-departed-primary-kept",
        "a replaced primary is forgotten and the writes it missed are re-sent",
        "lmcache_ec/remote/redis_cluster.py",
        "            departed = self._forget_departed(cluster)\n",
        "            departed = []\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_after_a_failover_the_shards_ke"
                "ys_are_served_by_its_new_primary"
            ),
        ),
    ),
    Mutation(
        "cluster-ping-in-turn",
        "one hung primary never keeps the cluster tier down",
        "lmcache_ec/remote/redis_cluster.py",
        '            first_answer(calls, "ec-cluster-ping")\n',
        (
            "            for call in calls:  # in turn: a hung first primary costs its timeout\n"
            "                try:\n"
            "                    return call()\n"
            "                except _NODE_ERRORS:\n"
            "                    pass\n"
            '            raise RedisConnectionError("none answers")\n'
        ),
        ("tests/cluster/test_cluster_topology.py::test_a_hung_primary_never_keeps_the_tier_down",),
    ),
    Mutation(
        "cluster-slot-map-asked-in-turn",
        "a hung startup node costs nothing while another answers",
        "lmcache_ec/remote/cluster_slots.py",
        (
            '        return first_answer(calls, "ec-cluster-slots", discard=lambda late: '
            "late.close())\n"
        ),
        (
            "        for call in calls[:-1]:  # in turn: each hung node costs its timeout\n"
            "            try:\n"
            "                return call()\n"
            "            except Exception:\n"
            "                pass\n"
            "        return calls[-1]()\n"
        ),
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_fresh_store_builds_its_slot_"
                "map_while_startup_nodes_hang"
            ),
        ),
    ),
    Mutation(
        "cluster-integer-range-reply-allocated",
        "a node's integer answer to a range read is damage, never an allocation of that size",
        "lmcache_ec/remote/redis_cluster.py",
        '    return bytes(reply) if isinstance(reply, (bytes, bytearray, memoryview)) else b""\n',
        "    return bytes(reply)\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_range_read_answered_with_an_"
                "integer_is_damage_not_an_allocation"
            ),
        ),
    ),
    Mutation(
        "device-batch-released-before-its-copies",
        "a batch copied to the device is read before its pool slots are reused",
        "lmcache_ec/storage/copy_out.py",
        "                torch.cuda.current_stream(device).synchronize()\n",
        "                pass\n",
        (
            (
                "tests/storage/test_device_copies.py::test_a_batch_to_the_device_is_read_bef"
                "ore_its_slots_are_reused"
            ),
        ),
    ),
    Mutation(
        "borrowed-slot-released-before-its-device-copy",
        "a borrowed view copied to the device is read before its pool slot is reused",
        "lmcache_ec/engine.py",
        "                        torch.cuda.current_stream().synchronize()\n",
        "                        pass\n",
        (
            (
                "tests/storage/test_device_copies.py::test_a_borrowed_view_copied_to_the_dev"
                "ice_is_read_before_its_slot_is_reused"
            ),
        ),
    ),
    Mutation(
        "pinned-pool-rounded-to-a-power-of-two",
        "with an accelerator the CPU pool locks exactly its size, not torch's power-of-two block",
        "lmcache_ec/tiers/allocator.py",
        (
            "            buffer = (\n"
            "                _page_locked(size) if pinned else torch.empty(size, "
            'dtype=torch.uint8, device="cpu")\n'
            "            )\n"
        ),
        (
            "            buffer = torch.empty(size, dtype=torch.uint8, "
            'device="cpu", pin_memory=pinned)\n'
        ),
        ("tests/storage/test_device_copies.py::test_the_pool_locks_exactly_its_size",),
    ),
    Mutation(
        "str-option-from-yaml-typed",
        "a str option is taken as written in the YAML file: weights_version 1.10 is not 1.1",
        "lmcache_ec/config.py",
        "            raw[name] = entry\n",
        "            pass\n",
        (
            (
                "tests/test_config_inputs.py::test_distinct_unquoted_yaml_values_of_a_string"
                "_option_stay_distinct[8-010-weights_version]"
            ),
            (
                "tests/test_config_inputs.py::test_an_engine_on_weights_1_10_never_reads_the"
                "_entry_of_weights_1_1"
            ),
        ),
    ),
    Mutation(
        "float-for-str-option-stringified",
        "a float for a str option from a mapping is refused (its written form is lost)",
        "lmcache_ec/config.py",
        (
            "    if isinstance(value, float):\n"
            '        raise ValueError(f"expected a string: quote it, a number loses digits '
            '({value!r})")\n'
            "    if not isinstance(value, (str, int)) or isinstance(value, bool):\n"
        ),
        "    if not isinstance(value, (str, int, float)) or isinstance(value, bool):\n",
        (
            (
                "tests/test_config_inputs.py::test_a_float_for_a_string_option_from_python_i"
                "s_refused[weights_version]"
            ),
        ),
    ),
    Mutation(
        "disk-path-symlink-loop-raises",
        "a disk directory through a symlink loop starts the engine without the disk tier",
        "lmcache_ec/config.py",
        "    return os.path.realpath(expanded)\n",
        "    return str(Path(expanded).resolve())\n",
        (
            (
                "tests/test_config_inputs.py::test_a_disk_directory_through_a_symlink_loop_s"
                "tarts_the_engine_without_it"
            ),
        ),
    ),
    Mutation(
        "disk-path-unknown-home-taken-as-relative",
        "local_disk: ~user of no such user is a ConfigError naming the key (exit 2)",
        "lmcache_ec/config.py",
        (
            '    if expanded.startswith("~"):  # ~user of no such user (or no home directory)\n'
            "        raise ConfigError(f\"{where}: 'local_disk' names an unknown home "
            'directory ({path})")\n'
        ),
        "",
        (
            (
                "tests/test_config_inputs.py::test_a_value_past_any_use_is_a_config_error_in"
                "_the_cli_not_a_traceback[unknown_home]"
            ),
        ),
    ),
    Mutation(
        "isfinite-on-a-huge-int",
        "an int past a float's range (read_threads: 9…9) is a ConfigError, not an OverflowError",
        "lmcache_ec/config_schema.py",
        "    return isinstance(value, float) and not math.isfinite(value)\n",
        "    return not math.isfinite(value)\n",
        (
            (
                "tests/test_config_inputs.py::test_a_value_past_any_use_is_a_config_error_in"
                "_the_cli_not_a_traceback[read_threads]"
            ),
            (
                "tests/test_config_inputs.py::test_a_read_threads_past_a_floats_range_in_the"
                "_environment_names_the_variable"
            ),
        ),
    ),
    Mutation(
        "node-dir-nul-byte-unchecked",
        "a NUL byte in node_dir is refused at load, naming the key",
        "lmcache_ec/config_schema.py",
        "            check=_non_empty_path,\n",
        "            check=_non_empty,\n",
        (
            (
                "tests/test_config_inputs.py::test_a_path_with_a_nul_byte_is_refused_at_load"
                "_naming_the_key[node_dir]"
            ),
        ),
    ),
    Mutation(
        "timeline-path-nul-byte-unchecked",
        "a NUL byte in timeline_path is refused at load, naming the key",
        "lmcache_ec/config_schema.py",
        (
            '            "unset: nothing is recorded.",\n'
            "            lmcache=False,\n"
            "            check=_path,\n"
        ),
        '            "unset: nothing is recorded.",\n            lmcache=False,\n',
        (
            (
                "tests/test_config_inputs.py::test_a_path_with_a_nul_byte_is_refused_at_load"
                "_naming_the_key[timeline_path]"
            ),
        ),
    ),
    Mutation(
        "timeline-write-valueerror-escapes",
        "a timeline that cannot be written (ValueError too) is off with one warning",
        "lmcache_ec/integration/vllm/timeline.py",
        "        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path\n",
        "        except OSError as exc:\n",
        (
            (
                "tests/test_config_inputs.py::test_a_timeline_that_cannot_be_written_is_off_"
                "with_one_warning"
            ),
        ),
    ),
    Mutation(
        "s3-endpoint-unchecked",
        "an s3_endpoint_url that can never open is refused at load",
        "lmcache_ec/config_schema.py",
        "            check=_s3_endpoint,\n",
        "",
        (
            (
                "tests/test_config_inputs.py::test_an_s3_endpoint_that_can_never_open_is_ref"
                "used_at_load[no_url]"
            ),
            (
                "tests/test_config_inputs.py::test_an_s3_endpoint_that_can_never_open_is_ref"
                "used_at_load[port]"
            ),
        ),
    ),
    Mutation(
        "s3-region-unchecked",
        "an s3_region that is no region name is refused at load",
        "lmcache_ec/config_schema.py",
        "            check=_s3_region,\n",
        "",
        (
            (
                "tests/test_config_inputs.py::test_an_s3_region_that_is_no_region_name_is_re"
                "fused_at_load"
            ),
        ),
    ),
    Mutation(
        "redis-upper-case-scheme-accepted",
        "REDIS:// (refused by redis-py at open) is refused at load",
        "lmcache_ec/remote_names.py",
        (
            "    if written != written.lower():  # redis-py takes only redis://, "
            "rediss://, unix://\n"
            '        raise ValueError(f"scheme {written}:// must be written in lower case")\n'
        ),
        "",
        (
            (
                "tests/test_config_inputs.py::test_a_redis_scheme_not_in_lower_case_is_refus"
                "ed_at_load[REDIS://h:6379]"
            ),
        ),
    ),
    Mutation(
        "redis-url-options-override-remote-timeout",
        "Redis URL options cannot lift the remote_timeout bound (socket_timeout=, retry…=)",
        "lmcache_ec/remote_names.py",
        '        if name in _REDIS_TIMING_OPTIONS or name.startswith("retry"):\n',
        "        if False:\n",
        (
            (
                "tests/test_config_inputs.py::test_redis_url_options_overriding_remote_timeo"
                "ut_are_refused[socket_timeout=15]"
            ),
        ),
    ),
    Mutation(
        "connector-not-created-logged-every-probe",
        "a remote connector that cannot be built is logged once per distinct error",
        "lmcache_ec/remote/backend.py",
        "        level = logging.DEBUG if seen else logging.WARNING\n",
        "        level = logging.WARNING\n",
        (
            (
                "tests/test_config_inputs.py::test_a_connector_that_cannot_be_built_is_logge"
                "d_once_not_at_every_probe"
            ),
        ),
    ),
    Mutation(
        "s3-endpoint-credentials-accepted",
        (
            "an s3_endpoint_url holding credentials is refused at load (they would only "
            "reach the logs)"
        ),
        "lmcache_ec/remote_names.py",
        "    if parsed.username is not None or parsed.password is not None:\n",
        "    if False:\n",
        ("tests/test_config_inputs.py::test_an_s3_endpoint_with_credentials_is_refused_at_load",),
    ),
    Mutation(
        "redis-listing-fails-on-a-wrong-type-key",
        "one Redis key of another type is one damaged entry, not a failed listing",
        "lmcache_ec/remote/redis_store.py",
        "            yield from _sized(names, pipe.execute(raise_on_error=False))\n",
        "            yield from _sized(names, pipe.execute())\n",
        (
            (
                "tests/cli/test_damaged_listing.py::test_a_redis_key_of_another_type_is_list"
                "ed_as_one_unreadable_entry"
            ),
            (
                "tests/cli/test_damaged_listing.py::test_a_purge_removes_a_wrong_type_entry_"
                "and_the_good_ones_beside_it"
            ),
        ),
    ),
    Mutation(
        "redis-listing-wrong-type-is-an-outage",
        "a wrong-type STRLEN reply is listed as a damaged entry (size 0), never raised",
        "lmcache_ec/remote/redis_store.py",
        "        if _wrong_type(size):\n            yield name, 0\n        elif _failed(size):\n",
        "        if isinstance(size, Exception):\n",
        (
            (
                "tests/cli/test_damaged_listing.py::test_a_redis_key_of_another_type_is_list"
                "ed_as_one_unreadable_entry"
            ),
        ),
    ),
    Mutation(
        "cluster-listing-fails-on-a-wrong-type-key",
        (
            "a Redis Cluster listing takes a key of another type as one damaged entry, not "
            "a partial listing"
        ),
        "lmcache_ec/remote/redis_cluster.py",
        "    return None if isinstance(reply, Exception) and not _wrong_type(reply) else reply\n",
        "    return None if isinstance(reply, Exception) else reply\n",
        (
            (
                "tests/cluster/test_redis_cluster.py::test_a_key_of_another_type_is_listed_a"
                "s_one_damaged_entry"
            ),
        ),
    ),
    Mutation(
        "purge-recorded-on-an-unlisted-remote",
        "a purge whose remote listing failed records and announces no purge there",
        "lmcache_ec/cli/purge_entries.py",
        (
            '    if "remote" in tiers and session.catalog is not None and "remote" not in '
            "session.skipped:\n"
        ),
        '    if "remote" in tiers and session.catalog is not None:\n',
        (
            (
                "tests/cli/test_damaged_listing.py::test_a_purge_whose_remote_listing_failed"
                "_records_and_announces_nothing_there"
            ),
        ),
    ),
    Mutation(
        "bench-remote-url-unchecked",
        "bench remote refuses a --redis-url that names no Redis server (exit 2, no traceback)",
        "lmcache_ec/cli/bench.py",
        (
            "    _check_redis_url(redis_url)\n"
            "    if redis_url and (reason := probe_redis(redis_url)):\n"
        ),
        "    if redis_url and (reason := probe_redis(redis_url)):\n",
        (
            (
                "tests/cli/test_bench_inputs.py::test_a_redis_url_that_names_no_redis_server"
                "_is_a_usage_error[http://x-mustnameoneRedisserver-remote]"
            ),
        ),
    ),
    Mutation(
        "bench-remote-dead-redis-traceback",
        "bench remote on a Redis that does not answer is an error naming it, before any job",
        "lmcache_ec/cli/bench.py",
        (
            "    if redis_url and (reason := probe_redis(redis_url)):\n"
            "        fail(reason)  # before starting a job: its error would be a worker's "
            "traceback\n"
        ),
        "",
        (
            (
                "tests/cli/test_bench_inputs.py::test_a_redis_that_does_not_answer_is_an_err"
                "or_naming_it"
            ),
        ),
    ),
    Mutation(
        "bench-remote-job-failure-traceback",
        "a bench remote job that fails is an error (exit 1), not a traceback",
        "lmcache_ec/cli/bench.py",
        (
            "    except RuntimeError as exc:  # a job failed: its last error line, not a "
            "traceback\n"
            '        fail(f"bench remote failed: {exc}")\n'
        ),
        "",
        ("tests/cli/test_bench_inputs.py::test_a_job_that_fails_is_an_error_not_a_traceback",),
    ),
    Mutation(
        "bench-local-missing-directory-traceback",
        "bench local refuses a --directory that does not exist",
        "lmcache_ec/cli/bench.py",
        (
            "    _check_directory(directory)\n"
            "    _check_startup_gb(startup_cpu_gb)\n"
            "    settings = LocalBenchSettings(\n"
        ),
        "    _check_startup_gb(startup_cpu_gb)\n    settings = LocalBenchSettings(\n",
        (
            (
                "tests/cli/test_bench_inputs.py::test_a_directory_that_does_not_exist_is_a_u"
                "sage_error[local]"
            ),
        ),
    ),
    Mutation(
        "bench-local-startup-size-unchecked",
        "bench local refuses a start-up CPU tier of no positive size (upstream never starts)",
        "lmcache_ec/cli/bench.py",
        "    _check_startup_gb(startup_cpu_gb)\n    settings = LocalBenchSettings(\n",
        "    settings = LocalBenchSettings(\n",
        (
            (
                "tests/cli/test_bench_inputs.py::test_a_startup_cpu_tier_of_no_positive_size"
                "_is_a_usage_error[-1-local]"
            ),
        ),
    ),
    Mutation(
        "bench-local-zero-threads",
        "bench local refuses --threads 0",
        "lmcache_ec/cli/bench.py",
        (
            '        typer.Option(min=1, help="torch intra-op threads during the run (same '
            'for every engine)."),\n'
        ),
        (
            '        typer.Option(help="torch intra-op threads during the run (same for '
            'every engine)."),\n'
        ),
        ("tests/cli/test_bench_inputs.py::test_zero_threads_is_a_usage_error",),
    ),
    Mutation(
        "concurrent-pairs-counted-as-independent",
        "a concurrent round counts once in the sign test",
        "lmcache_ec/bench/serve_rows.py",
        '    found = sample.get("round") if mode == "concurrent" else None\n',
        "    found = None\n",
        (
            (
                "tests/cli/test_bench_statistics.py::test_a_concurrent_round_counts_once_and"
                "_four_rounds_give_no_verdict"
            ),
            (
                "tests/cli/test_bench_statistics.py::test_a_concurrent_interval_is_over_the_"
                "rounds_medians"
            ),
            (
                "tests/cli/test_bench_statistics.py::test_concurrent_verdicts_at_the_target_"
                "are_wrong_at_most_the_intervals_five_percent"
            ),
        ),
    ),
    Mutation(
        "concurrent-samples-without-their-round",
        "run_block numbers each sample's round",
        "lmcache_ec/bench/serve.py",
        "                        round=number,\n",
        "",
        ("tests/cli/test_bench_statistics.py::test_run_block_numbers_its_rounds_and_its_blocks",),
    ),
    Mutation(
        "example-row-of-another-block",
        "only rows of one block pair up against ECExampleConnector",
        "lmcache_ec/bench/serve_rows.py",
        '    return row.get("block"), pattern, row["mode"]\n',
        '    return None, pattern, row["mode"]\n',
        (
            (
                "tests/cli/test_bench_statistics.py::test_the_same_ratio_twice_pairs_each_bl"
                "ock_with_its_own_example_run"
            ),
        ),
    ),
    Mutation(
        "blocks-not-numbered",
        "each run_block call's rows carry their own block index",
        "lmcache_ec/bench/serve.py",
        "        self.blocks_run += 1\n",
        "",
        ("tests/cli/test_bench_statistics.py::test_run_block_numbers_its_rounds_and_its_blocks",),
    ),
    Mutation(
        "timeline-takes-a-later-requests-worker-event",
        "a hit's timeline takes only worker events before its first token",
        "lmcache_ec/bench/serve_timeline.py",
        "                if seen <= t <= first_token\n",
        "                if seen <= t\n",
        (
            (
                "tests/cli/test_bench_statistics.py::test_a_hit_timeline_takes_no_worker_eve"
                "nt_of_a_later_request"
            ),
        ),
    ),
    Mutation(
        "too-few-pairs-said-as-no-pairs",
        "a row with too few pairs says how many and how many are needed",
        "lmcache_ec/bench/serve_report.py",
        "            texts.append(f\"{t['verdict'].upper()} ({_no_interval(t)}): {t['text']}\")\n",
        "            texts.append(f\"{t['verdict'].upper()} (no pairs): {t['text']}\")\n",
        (
            (
                "tests/cli/test_bench_statistics.py::test_a_row_with_three_pairs_says_so_and"
                "_the_summary_counts_it_apart"
            ),
        ),
    ),
    Mutation(
        "too-few-pairs-counted-as-containing-the-target",
        "the summary counts too few pairs apart",
        "lmcache_ec/bench/serve_report.py",
        (
            '    few = sum(t["value"] is None and t.get("no_interval", "too few") == "too '
            'few" for t in targets)\n'
        ),
        "    few = 0\n",
        (
            (
                "tests/cli/test_bench_statistics.py::test_a_row_with_three_pairs_says_so_and"
                "_the_summary_counts_it_apart"
            ),
        ),
    ),
    Mutation(
        "failed-request-escapes-as-openai-error",
        "a failed request is a ServerError with the server's log, not a traceback",
        "lmcache_ec/bench/serve.py",
        (
            "        except (openai.OpenAIError, httpx.HTTPError) as exc:  # neither is a "
            "RuntimeError\n"
        ),
        "        except ServerError as exc:\n",
        (
            (
                "tests/cli/test_bench_statistics.py::test_a_failed_request_is_a_server_error"
                "_with_the_servers_log"
            ),
        ),
    ),
    Mutation(
        "p99-of-100-is-the-maximum",
        "p99 is the nearest rank: of 100 samples the 99th, not the maximum",
        "lmcache_ec/bench/measure.py",
        "    rank = math.ceil(round(len(ordered) * q, 9))\n",
        "    rank = int(len(ordered) * q) + 1\n",
        (
            "tests/cli/test_bench_statistics.py::test_p99_is_the_nearest_rank_not_the_maximum",
            (
                "tests/cli/test_bench_statistics.py::test_the_channel_benchmarks_p99_is_the_"
                "shared_nearest_rank"
            ),
        ),
    ),
    Mutation(
        "channel-p99-own-formula",
        "bench channel's p99 is the shared nearest-rank p99",
        "lmcache_ec/bench/channel_load.py",
        '        "busy_p99_ms": percentile(busy_ms, 0.99) if busy_ms else 0.0,\n',
        (
            '        "busy_p99_ms": sorted(busy_ms)[min(len(busy_ms) - 1, int(len(busy_ms) '
            "* 0.99))] if busy_ms else 0.0,\n"
        ),
        (
            (
                "tests/cli/test_bench_statistics.py::test_the_channel_benchmarks_p99_is_the_"
                "shared_nearest_rank"
            ),
        ),
    ),
    Mutation(
        "green-with-an-inconclusive-target",
        "a row is green only when every target passed",
        "lmcache_ec/bench/serve_report.py",
        '    return "green" if verdicts and all(v is True for v in verdicts) else None\n',
        '    return "green" if True in verdicts else None\n',
        ("tests/cli/test_bench_statistics.py::test_a_row_is_green_only_when_every_target_passed",),
    ),
    Mutation(
        "redis-listing-by-metadata-key",
        "a Redis entry is its frame key: listed and purged without its metadata key",
        "lmcache_ec/remote/redis_store.py",
        '    pattern = _glob_escape(prefix) + "*" + REDIS_DATA_SUFFIX\n',
        '    pattern = _glob_escape(prefix) + "*" + "metadata"\n',
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_redis_frame_whose_metadata_key_is_go"
                "ne_is_listed_and_purged"
            ),
        ),
    ),
    Mutation(
        "disk-log-signature-kept-on-failed-read",
        "a disk purge log that failed to read once is read again",
        "lmcache_ec/purge/marker.py",
        "        try:\n            data = read_disk(self.disk_dir, self.namespace)\n",
        (
            "        self._disk_signature = signature\n"
            "        try:\n"
            "            data = read_disk(self.disk_dir, self.namespace)\n"
        ),
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_disk_purge_log_that_could_not_be_rea"
                "d_once_is_read_at_the_next_check"
            ),
        ),
    ),
    Mutation(
        "remove-ignores-queued-writes",
        "remove waits for the key's queued writes before deleting",
        "lmcache_ec/storage/reads.py",
        "        landed = self._wait_for_writes(key, self._write_wait_s)\n",
        "        landed = True\n",
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_removal_right_after_put_is_not_undon"
                "e_by_the_entrys_queued_writes[writes-land-first]"
            ),
        ),
    ),
    Mutation(
        "remove-not-repeated-after-late-write",
        "a write that outlasts close_timeout is removed again once it lands",
        "lmcache_ec/storage/reads.py",
        "        if not landed:\n            self._remove_when_landed(key)\n",
        "",
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_removal_right_after_put_is_not_undon"
                "e_by_the_entrys_queued_writes[outwaited]"
            ),
        ),
    ),
    Mutation(
        "header-read-failure-not-reported",
        "a purge whose header reads failed says so and exits 1",
        "lmcache_ec/purge/inventory.py",
        "                entry.read_failed = True\n",
        "",
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_purge_whose_header_reads_the_store_f"
                "ailed_says_so_and_exits_1[older-than]"
            ),
        ),
    ),
    Mutation(
        "header-read-failure-read-as-damage",
        "a store failure reading a header is not a damaged header",
        "lmcache_ec/remote/catalog.py",
        "            if strict:\n",
        "            if False:\n",
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_purge_whose_header_reads_the_store_f"
                "ailed_says_so_and_exits_1[older-than]"
            ),
        ),
    ),
    Mutation(
        "header-read-not-retried",
        "a failed header read is retried once",
        "lmcache_ec/purge/inventory.py",
        (
            "HEADER_READ_TRIES = 2  # a store failure is retried once: one slow moment is "
            "no unknown entry\n"
        ),
        "HEADER_READ_TRIES = 1\n",
        (
            (
                "tests/purge/test_purge_gaps.py::test_a_purge_whose_header_reads_the_store_f"
                "ailed_says_so_and_exits_1[older-than]"
            ),
        ),
    ),
    Mutation(
        "run-without-its-clone-first-on-pythonpath",
        "what ./run starts imports its own clone, whichever clone the shared venv points at",
        "run",
        'export PATH="$VENV/bin:$PATH" PYTHONPATH=$THIS_CLONE_FIRST\n',
        'export PATH="$VENV/bin:$PATH"\n',
        (
            (
                "tests/test_run_script.py::test_what_each_run_starts_imports_its_own_clone_w"
                "hile_clones_share_the_venv"
            ),
        ),
    ),
    Mutation(
        "run-suite-without-its-clone-first-on-pythonpath",
        "the suite ./run starts imports its own clone, whichever clone the shared venv points at",
        "run",
        (
            '    PATH="$VENV/bin:$PATH" PYTHONPATH=$THIS_CLONE_FIRST python -m pytest "$@" '
            "|| rc=$?\n"
        ),
        '    PATH="$VENV/bin:$PATH" python -m pytest "$@" || rc=$?\n',
        ("tests/test_run_script.py::test_the_suite_runs_with_its_own_clone_first_on_pythonpath",),
    ),
    Mutation(
        "run-re-points-a-venv-another-run-uses",
        "./run never reinstalls the package in a venv another ./run is using",
        "run",
        '    elif flock -x -n "$use" && ! points_at_this_clone; then\n',
        "    elif ! points_at_this_clone; then\n",
        (
            (
                "tests/test_run_script.py::test_what_each_run_starts_imports_its_own_clone_w"
                "hile_clones_share_the_venv"
            ),
        ),
    ),
    Mutation(
        "run-checks-and-builds-without-the-build-lock",
        "two ./run at once build a venv once and never delete it under each other",
        "run",
        '    lock -x "$build" "to finish building or checking $VENV"\n',
        "",
        (
            (
                "tests/test_run_script.py::test_two_runs_at_once_build_the_venv_once_and_nei"
                "ther_deletes_it_under_the_other"
            ),
        ),
    ),
    Mutation(
        "run-deletes-a-directory-it-did-not-make",
        "a directory LMCACHE_EC_VENV names that ./run did not make is never deleted",
        "run",
        (
            '    [ -n "$VENV_FAMILY" ] || [ -e "$VENV/.complete" ] || [ -e '
            '"$VENV/.building" ] ||\n'
            '        [ -z "$(ls -A "$VENV" 2>/dev/null)" ]\n'
        ),
        "    true\n",
        (
            (
                "tests/test_run_script.py::test_a_directory_lmcache_ec_venv_names_that_run_d"
                "id_not_make_is_never_deleted"
            ),
        ),
    ),
    Mutation(
        "run-reuses-a-venv-built-for-other-dependencies",
        "a venv is rebuilt when the dependencies it was built for change (LMCACHE_EC_VENV too)",
        "run",
        (
            '    if [ "$held" != "$VENV_KEY" ] && { [ -n "$held" ] || [ "${VENV##*/}" != '
            '"$VENV_NAME" ]; }; then\n'
        ),
        "    if false; then\n",
        (
            (
                "tests/test_run_script.py::test_a_venv_lmcache_ec_venv_names_is_rebuilt_when"
                "_the_dependencies_change"
            ),
        ),
    ),
    Mutation(
        "run-rebuilds-venvs-with-an-unkeyed-marker",
        "a venv built before markers held the key is used as it is, not rebuilt",
        "run",
        (
            '    if [ "$held" != "$VENV_KEY" ] && { [ -n "$held" ] || [ "${VENV##*/}" != '
            '"$VENV_NAME" ]; }; then\n'
        ),
        '    if [ "$held" != "$VENV_KEY" ]; then\n',
        (
            (
                "tests/test_run_script.py::test_a_venv_built_before_markers_held_the_key_is_"
                "used_as_it_is"
            ),
        ),
    ),
    Mutation(
        "run-re-points-with-build-isolation",
        "pointing a shared venv at another clone needs no network",
        "run",
        '        pip_logged install --no-deps --no-build-isolation -e "$ROOT"\n',
        '        pip_logged install --no-deps -e "$ROOT"\n',
        (
            (
                "tests/test_run_script.py::test_a_second_clone_points_the_shared_venv_at_its"
                "elf_offline"
            ),
        ),
    ),
    Mutation(
        "run-compares-the-percent-encoded-url",
        "a clone whose path has a space is pointed at once, not on every run",
        "run",
        "sys.exit(0 if unquote(urlsplit(url).path) == sys.argv[1] else 1)\n",
        'sys.exit(0 if url == "file://" + sys.argv[1] else 1)\n',
        (
            (
                "tests/test_run_script.py::test_a_clone_whose_path_has_a_space_is_pointed_at"
                "_once_not_on_every_run"
            ),
        ),
    ),
    Mutation(
        "run-uses-a-venv-whose-python-is-gone",
        "a venv whose python no longer starts is rebuilt",
        "run",
        '    if ! "$VENV/bin/python" -c pass 2>/dev/null; then\n',
        "    if false; then\n",
        ("tests/test_run_script.py::test_a_venv_whose_python_is_gone_is_rebuilt",),
    ),
    Mutation(
        "run-takes-any-existing-path-for-tests",
        "an option value that is a path does not skip the vLLM 0.33 part",
        "run",
        "        [[ $path == tests || $path == tests/* ]] && return 0\n",
        "        [[ $arg != -* && -e $path ]] && return 0\n",
        (
            (
                "tests/test_run_script.py::test_an_option_value_that_is_a_path_does_not_skip"
                "_the_other_vllm_parts[--html]"
            ),
        ),
    ),
    Mutation(
        "run-takes-an-option-value-under-tests-for-tests",
        "`--deselect tests/...` does not skip the vLLM 0.33 part",
        "run",
        '        [[ $PATH_OPTIONS == *[[:space:]]"$arg"[[:space:]]* ]] && skip=1\n',
        "",
        (
            (
                "tests/test_run_script.py::test_an_option_value_that_is_a_path_does_not_skip"
                "_the_other_vllm_parts[--deselect]"
            ),
        ),
    ),
    Mutation(
        "run-keeps-stale-venvs",
        "a build removes the stale venvs of its kind that no ./run uses",
        "run",
        "        remove_stale_siblings\n",
        "",
        (
            (
                "tests/test_run_script.py::test_a_build_removes_the_stale_venvs_of_its_kind_"
                "that_no_run_uses"
            ),
        ),
    ),
    Mutation(
        "run-removes-a-venv-in-use",
        "a build never removes a venv another ./run is using",
        "run",
        '        if flock -x -n "$build" && flock -x -n "$use"; then\n',
        "        if true; then\n",
        (
            (
                "tests/test_run_script.py::test_a_build_removes_the_stale_venvs_of_its_kind_"
                "that_no_run_uses"
            ),
        ),
    ),
    Mutation(
        "run-holds-no-lock-on-the-venv-it-uses",
        "a venv stays held while the ./run using it lasts",
        "run",
        '    flock -s "$use"\n',
        '    flock -u "$use"\n',
        (
            (
                "tests/test_run_script.py::test_a_build_removes_the_stale_venvs_of_its_kind_"
                "that_no_run_uses"
            ),
        ),
    ),
    Mutation(
        "run-installs-redis-server-two-at-once",
        "two ./run without redis-server install it once, neither fails on apt's lock",
        "run",
        (
            '    flock -x -n "$apt_lock" || {\n'
            '        log "waiting for another ./run to finish installing redis-server"\n'
            '        flock -x -w 600 "$apt_lock" || true\n'
            "    }\n"
        ),
        "",
        ("tests/test_run_script.py::test_two_runs_without_redis_server_install_it_once",),
    ),
    Mutation(
        "run-takes-absolute-test-paths-for-the-suite",
        "./run test with an absolute path under the clone's tests runs those tests only",
        "run",
        '        path=${path#"$ROOT"/}\n',
        "",
        (
            (
                "tests/test_run_script.py::test_test_paths_run_in_one_pytest_in_the_serving_"
                "venv[{clone}/tests/test_key.py]"
            ),
        ),
    ),
    Mutation(
        "run-removes-venvs-used-within-the-day",
        "a build removes only venvs ./run built and nobody used for a day (another clone's stays)",
        "run",
        '        stale "$dir" || continue\n',
        "",
        (
            (
                "tests/test_run_script.py::test_a_build_removes_the_stale_venvs_of_its_kind_"
                "that_no_run_uses"
            ),
        ),
    ),
    Mutation(
        "pinned-pool-left-locked-after-close",
        "the CPU pool locked in place is unlocked when the cache closes",
        "lmcache_ec/tiers/allocator.py",
        "            _page_unlock(locked)\n",
        "            pass\n",
        ("tests/storage/test_device_copies.py::test_the_pool_locks_exactly_its_size",),
    ),
    Mutation(
        "failed-page-lock-error-left-pending",
        "a refused page lock leaves no CUDA error pending for a later kernel launch",
        "lmcache_ec/tiers/allocator.py",
        "            clear()\n",
        "            pass\n",
        ("tests/storage/test_device_copies.py::test_a_pool_the_host_will_not_lock_is_halved",),
    ),
    Mutation(
        "unix-socket-url-taken-as-its-scheme",
        "unix:/path with capitals in its path loads: only the scheme must be lower case",
        "lmcache_ec/remote_names.py",
        '    written = url.split(":", 1)[0]  # the scheme as written (unix:/path has no //)\n',
        '    written = url.partition("://")[0]\n',
        (
            (
                "tests/test_config_inputs.py::test_a_unix_socket_url_without_slashes_and_wit"
                "h_capitals_in_its_path_loads"
            ),
        ),
    ),
    Mutation(
        "claims-wait-a-hung-store-each-time",
        (
            "after a claim the store failed, claims and releases skip it for "
            "remote_retry_interval (one WARNING)"
        ),
        "lmcache_ec/remote/catalog.py",
        "        return time.monotonic() < self._down_until\n",
        "        return False\n",
        (
            (
                "tests/remote/test_claims.py::test_claims_in_an_outage_skip_the_store_until_"
                "its_retry_interval"
            ),
        ),
    ),
    Mutation(
        "claims-never-retried-after-an-outage",
        "claims ask the store again once remote_retry_interval has passed",
        "lmcache_ec/remote/catalog.py",
        "        self._down_until = time.monotonic() + self._retry_interval\n",
        '        self._down_until = float("inf")\n',
        ("tests/remote/test_claims.py::test_claims_reach_the_store_again_after_an_outage",),
    ),
    Mutation(
        "get-or-compute-reads-under-the-current-identity",
        (
            "get_or_compute reads under the identity its call started with, not one "
            "set_identity set meanwhile"
        ),
        "lmcache_ec/storage/get_or_compute.py",
        "        return self._read_keys([self._key(h, identity) for h in hashes], device)\n",
        "        return self._read_keys([self._cache.key(h) for h in hashes], device)\n",
        (
            (
                "tests/storage/test_get_or_compute_identity.py::test_a_lookup_begun_before_s"
                "et_identity_never_returns_the_new_identitys_entry"
            ),
            (
                "tests/storage/test_get_or_compute_identity.py::test_a_wait_across_set_ident"
                "ity_loads_the_holders_output_not_the_new_identitys"
            ),
        ),
    ),
    Mutation(
        "put-checks-the-dtype-of-the-current-identity",
        "put stores a tensor only of its key's dtype, whatever set_identity does meanwhile",
        "lmcache_ec/engine.py",
        (
            "        validate_tensor(tensor, key.identity.dtype)  # the key's: "
            "set_identity may run meanwhile\n"
        ),
        "        validate_tensor(tensor, self.identity.dtype)\n",
        (
            (
                "tests/storage/test_get_or_compute_identity.py::test_a_put_across_set_identi"
                "ty_never_stores_a_frame_of_another_dtype_than_its_key[put]"
            ),
        ),
    ),
    Mutation(
        "put-many-checks-the-dtype-of-the-current-identity",
        "put_many stores a tensor only of its key's dtype, whatever set_identity does meanwhile",
        "lmcache_ec/engine.py",
        "            validate_tensor(tensor, key.identity.dtype)\n",
        "            validate_tensor(tensor, self.identity.dtype)\n",
        (
            (
                "tests/storage/test_get_or_compute_identity.py::test_a_put_across_set_identi"
                "ty_never_stores_a_frame_of_another_dtype_than_its_key[put_many]"
            ),
        ),
    ),
    Mutation(
        "redis-url-port-error-repeats-the-password",
        (
            "a URL whose password holds '/', '?' or '#' is refused without repeating it "
            "(the parser takes it for the port)"
        ),
        "lmcache_ec/remote_names.py",
        (
            '        if str(exc).startswith("Port out of range"):  # holds no text of the URL\'s\n'
            "            raise\n"
        ),
        "        raise\n",
        (
            (
                "tests/test_config.py::test_a_config_error_never_shows_a_password[section3-p"
                "ercent-encoded]"
            ),
            (
                "tests/test_config.py::test_a_config_error_never_shows_a_password[section5-p"
                "ercent-encoded]"
            ),
        ),
    ),
    Mutation(
        "cpu-grant-warning-in-decimal-gb",
        "the CPU tier's smaller-pool warning gives sizes in the config's GB (1024**3 bytes)",
        "lmcache_ec/tiers/allocator.py",
        "                wanted / GB,\n",
        "                wanted / 1e9,\n",
        (
            (
                "tests/test_engine.py::test_a_cpu_pool_larger_than_the_host_grants_is_a_smal"
                "ler_pool_not_a_failed_start"
            ),
        ),
    ),
    Mutation(
        "max-inflight-items-zero-taken",
        "max_inflight_items: 0 (no prefetch ever) is refused, not silently taken as 1",
        "lmcache_ec/integration/vllm/connector_options.py",
        "    if name in _AT_LEAST_ONE and number < 1:\n",
        "    if False:\n",
        (
            (
                "tests/test_config.py::test_connector_options_refuse_what_is_not_a_finite_nu"
                "mber_at_least_zero[max_inflight_items-0]"
            ),
        ),
    ),
    Mutation(
        "stage-dispatch-before-reconnect",
        "items a reconnect's weights change gives up mid-dispatch are computed, never staged",
        "lmcache_ec/integration/vllm/worker_link.py",
        (
            "        self.channel_ready()\n"
            "        started = self.prefetch.dispatch()  # each with its deadline: "
            "queueing counts\n"
        ),
        (
            "        started = self.prefetch.dispatch()  # each with its deadline: "
            "queueing counts\n"
            "        self.channel_ready()\n"
        ),
        (
            (
                "tests/vllm/test_stage_channel_reconnect.py::test_weights_heard_on_a_reconne"
                "ct_mid_dispatch_compute_the_item_not_crash_the_step"
            ),
        ),
    ),
    Mutation(
        "stage-socket-without-instance",
        "two engines launched with one engine id never share a stage socket",
        "lmcache_ec/integration/vllm/connector.py",
        "    return socket_path(engine_id, dp_rank, rank, node_dir, instance=instance)\n",
        "    return socket_path(engine_id, dp_rank, rank, node_dir)\n",
        (
            (
                "tests/vllm/test_stage_channel_naming.py::test_two_engines_launched_with_one"
                "_engine_id_each_stage_only_their_own_orders"
            ),
        ),
    ),
    Mutation(
        "stage-socket-digest-without-engine-id",
        "engine ids a file name cannot tell apart get stage sockets of their own",
        "lmcache_ec/runtime_dirs.py",
        (
            "    digest = hashlib.blake2b(repr((engine_id, instance)).encode(), "
            "digest_size=8).hexdigest()\n"
        ),
        "    digest = hashlib.blake2b(repr(instance).encode(), digest_size=8).hexdigest()\n",
        (
            (
                "tests/vllm/test_stage_channel_naming.py::test_engine_ids_a_file_name_cannot"
                "_tell_apart_get_sockets_of_their_own"
            ),
        ),
    ),
    Mutation(
        "stage-stalled-frame-closed-at-any-accept",
        "an order an idle scheduler left half written keeps its link while the worker has room",
        "lmcache_ec/integration/vllm/channel.py",
        "            if full and not self._free_stalled(now):\n",
        "            if not self._free_stalled(now):\n",
        (
            (
                "tests/chaos/test_stage_channel_partial_frames.py::test_an_order_an_idle_sch"
                "eduler_left_half_written_is_served_when_it_writes_the_rest"
            ),
        ),
    ),
    Mutation(
        "stage-frame-deadline-from-its-first-byte",
        "a worker's large frame read across an idle scheduler step arrives whole",
        "lmcache_ec/integration/vllm/stage_frames.py",
        "            self._since = now\n            self._buffer += data\n",
        (
            "            if not self._buffer:\n"
            "                self._since = now\n"
            "            self._buffer += data\n"
        ),
        (
            (
                "tests/chaos/test_stage_channel_partial_frames.py::test_a_large_report_read_"
                "across_an_idle_scheduler_step_arrives_whole"
            ),
        ),
    ),
    Mutation(
        "stage-dead-sockets-kept",
        "a starting worker removes the stage sockets of killed engines",
        "lmcache_ec/integration/vllm/channel.py",
        "        _remove_dead_sockets(os.path.dirname(path), path)\n",
        "",
        (
            (
                "tests/chaos/test_stage_channel_stale_sockets.py::test_a_starting_worker_rem"
                "oves_dead_stage_sockets_and_nothing_else"
            ),
            (
                "tests/chaos/test_stage_channel_stale_sockets.py::test_a_start_probes_a_boun"
                "ded_number_of_sockets_and_later_starts_the_rest"
            ),
        ),
    ),
    Mutation(
        "stage-sweep-removes-any-file",
        "the sweep removes only old socket files, never a link, a file or a fresh socket",
        "lmcache_ec/integration/vllm/channel.py",
        "                if stat.S_ISSOCK(info.st_mode) and info.st_mtime < old:\n",
        "                if True:\n",
        (
            (
                "tests/chaos/test_stage_channel_stale_sockets.py::test_a_starting_worker_rem"
                "oves_dead_stage_sockets_and_nothing_else"
            ),
        ),
    ),
    Mutation(
        "stage-sweep-removes-a-busy-listener",
        "the sweep never removes a live socket whose backlog is full",
        "lmcache_ec/integration/vllm/channel.py",
        "        return False  # live (EAGAIN: a full backlog), or not ours to judge\n",
        "        pass\n",
        (
            (
                "tests/chaos/test_stage_channel_stale_sockets.py::test_a_starting_worker_rem"
                "oves_dead_stage_sockets_and_nothing_else"
            ),
        ),
    ),
    Mutation(
        "stage-sweep-unbounded",
        "a start probes a bounded number of sockets",
        "lmcache_ec/integration/vllm/channel.py",
        "                if probed >= _SWEEP_MAX:\n                    break\n",
        "",
        (
            (
                "tests/chaos/test_stage_channel_stale_sockets.py::test_a_start_probes_a_boun"
                "ded_number_of_sockets_and_later_starts_the_rest"
            ),
        ),
    ),
    Mutation(
        "node-entry-of-another-user-served",
        "a node-tier entry another local user owns is a miss, never a tensor",
        "lmcache_ec/tiers/frame_directory.py",
        (
            "        if self.entries_owned and info.st_uid != os.getuid():  # of the file "
            "read, not the path\n"
        ),
        "        if False:\n",
        (
            (
                "tests/tiers/test_node_ownership.py::test_a_frame_in_a_node_directory_anothe"
                "r_user_made_again_is_a_miss"
            ),
        ),
    ),
    Mutation(
        "node-contains-another-users-entry",
        "contains says no to a node-tier entry another local user owns",
        "lmcache_ec/tiers/frame_directory.py",
        "            return os.stat(self.path_of(key)).st_uid == os.getuid()\n",
        "            return os.path.exists(self.path_of(key))\n",
        (
            (
                "tests/tiers/test_node_ownership.py::test_a_frame_in_a_node_directory_anothe"
                "r_user_made_again_is_a_miss"
            ),
        ),
    ),
    Mutation(
        "node-directory-of-another-user-joined",
        "a node directory another user made again is never written, cleared or waited on",
        "lmcache_ec/tiers/node.py",
        (
            "            if owner != os.getuid():\n"
            "                raise RuntimeDirUnavailable(self._directory, Reason.TAKEN, "
            "owner_of(owner))\n"
        ),
        "",
        (
            (
                "tests/tiers/test_node_ownership.py::test_a_put_into_a_node_directory_anothe"
                "r_user_made_again_writes_nothing_there"
            ),
            (
                "tests/tiers/test_node_ownership.py::test_a_put_never_waits_on_a_users_lock_"
                "another_user_holds"
            ),
            (
                "tests/tiers/test_node_ownership.py::test_the_last_user_leaving_clears_nothi"
                "ng_in_a_directory_another_user_made_again"
            ),
        ),
    ),
    Mutation(
        "forked-child-keeps-node-users-lock",
        "a child forked from a node-tier user holds no lock on .users",
        "lmcache_ec/tiers/node.py",
        "        drop_locks_in_child(self)\n",
        "",
        (
            (
                "tests/tiers/test_fork_locks.py::test_a_user_leaving_last_leaves_users_free_"
                "whatever_it_forked"
            ),
        ),
    ),
    Mutation(
        "leave-converts-a-shared-description",
        "leaving never turns a lock a forked child shares into an exclusive one",
        "lmcache_ec/tiers/node.py",
        (
            "                if not self._reopen():\n"
            "                    return 0  # gone, or no longer this user's: nothing of "
            "ours to clear\n"
        ),
        "",
        (
            (
                "tests/tiers/test_fork_locks.py::test_leaving_converts_no_lock_a_child_forke"
                "d_by_c_code_shares"
            ),
            (
                "tests/tiers/test_node_tier.py::test_a_user_leaving_a_directory_another_made"
                "_again_clears_nothing"
            ),
        ),
    ),
    Mutation(
        "forked-child-keeps-ledger-lock",
        "a child forked while the ledger is locked holds none of it",
        "lmcache_ec/tiers/budget.py",
        "        drop_locks_in_child(self)\n",
        "",
        (
            (
                "tests/tiers/test_fork_locks.py::test_a_ledger_locked_while_the_process_fork"
                "s_is_free_once_it_lets_go"
            ),
            (
                "tests/tiers/test_fork_locks.py::test_a_child_forked_while_another_thread_ho"
                "lds_the_ledger_can_use_it"
            ),
        ),
    ),
    Mutation(
        "forked-child-keeps-ledger-thread-lock",
        "a forked child can use a ledger another thread of its parent held",
        "lmcache_ec/tiers/budget.py",
        "        self._fd = close_inherited(self._fd)\n        self._local = threading.Lock()\n",
        "        self._fd = close_inherited(self._fd)\n",
        (
            (
                "tests/tiers/test_fork_locks.py::test_a_child_forked_while_another_thread_ho"
                "lds_the_ledger_can_use_it"
            ),
        ),
    ),
    Mutation(
        "reservation-not-allocated",
        "node-tier writers at once leave the filesystem's reserve free",
        "lmcache_ec/tiers/budget.py",
        (
            "            temp = self.layout.create_temp(name, size, "
            "allocate=self.capped_by_free_space)\n"
        ),
        "            temp = self.layout.create_temp(name, size)\n",
        (
            (
                "tests/tiers/test_reserve_races.py::test_writers_reserving_at_once_leave_the"
                "_filesystems_reserve_free"
            ),
        ),
    ),
    Mutation(
        "reserved-blocks-truncated-at-open",
        "a reservation's blocks stay taken while its write is in progress",
        "lmcache_ec/tiers/disk_layout.py",
        "    return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)\n",
        "    return os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)\n",
        (
            (
                "tests/tiers/test_reserve_races.py::test_a_reserved_temp_file_keeps_its_bloc"
                "ks_when_opened_for_writing"
            ),
        ),
    ),
    Mutation(
        "removal-subtracts-a-symlinks-target",
        "a symlink under an entry's name takes nothing off the size ledger",
        "lmcache_ec/tiers/budget.py",
        "                freed = file_bytes(os.lstat(path)) if size is None else size\n",
        "                freed = os.stat(path).st_size if size is None else size\n",
        (
            (
                "tests/tiers/test_planted_links.py::test_a_symlink_removed_as_damaged_takes_"
                "none_of_its_targets_bytes_off_the_ledger"
            ),
        ),
    ),
    Mutation(
        "scan-follows-a-symlink",
        "a scan counts a symlink under an entry's name at 0 bytes",
        "lmcache_ec/tiers/disk_layout.py",
        (
            "                stat = item.stat(follow_symlinks=False)\n"
            "            except OSError:\n"
            "                continue  # vanished while scanning\n"
        ),
        (
            "                stat = item.stat()\n"
            "            except OSError:\n"
            "                continue  # vanished while scanning\n"
        ),
        (
            (
                "tests/tiers/test_planted_links.py::test_a_scan_counts_a_symlink_under_an_en"
                "try_name_at_nothing"
            ),
        ),
    ),
    Mutation(
        "sleep-unwatched",
        (
            "weights loaded between sleep and the next step (the RL loop's own sync) are "
            "fingerprinted before anything is loaded or saved"
        ),
        "lmcache_ec/integration/vllm/weight_updates.py",
        '    ("vllm.v1.worker.gpu_worker", "Worker", "sleep", ASLEEP),\n',
        "",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_weight_sync_between_sleep_and_wake_"
                "up_is_fingerprinted_at_the_next_step"
            ),
        ),
    ),
    Mutation(
        "step-after-sleep-unwatched",
        "the first step after a sleep fingerprints the weights it runs with",
        "lmcache_ec/integration/vllm/weight_updates.py",
        '    ("vllm.v1.worker.gpu_worker", "Worker", "execute_model", STEP),\n',
        "",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_weight_sync_between_sleep_and_wake_"
                "up_is_fingerprinted_at_the_next_step"
            ),
            (
                "tests/vllm/test_weight_seams.py::test_while_asleep_no_seam_reads_the_weight"
                "s_and_the_next_step_reads_them_once"
            ),
        ),
    ),
    Mutation(
        "seams-read-a-sleeping-worker",
        "no seam reads a sleeping worker's weights; the next step reads them once",
        "lmcache_ec/integration/vllm/weight_updates.py",
        "    unknown = kind in (REPLACING, ASLEEP) or _Slept.due  # asleep: nothing to read yet\n",
        "    unknown = kind in (REPLACING, ASLEEP)\n",
        (
            (
                "tests/vllm/test_weight_seams.py::test_while_asleep_no_seam_reads_the_weight"
                "s_and_the_next_step_reads_them_once"
            ),
        ),
    ),
    Mutation(
        "reset-weights-unwatched",
        "Worker.reset_weights (the /weight_checker reset) is a weight change",
        "lmcache_ec/integration/vllm/weight_updates.py",
        '    ("vllm.v1.worker.gpu_worker", "Worker", "reset_weights", "worker"),\n',
        "",
        ("tests/vllm/test_weight_seams.py::test_reset_weights_is_a_weight_change",),
    ),
    Mutation(
        "direct-read-while-weights-unknown",
        "while the weights are unknown nothing is read under the key of no weights",
        "lmcache_ec/integration/vllm/worker.py",
        "        if not known:\n",
        "        if False:\n",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_load_missing_its_staged_copy_reads_"
                "nothing_while_the_weights_are_unknown"
            ),
        ),
    ),
    Mutation(
        "promised-load-dropped-by-a-weights-change",
        "a load the scheduler promised before it heard of a weights change never misses",
        "lmcache_ec/integration/vllm/staged_copies.py",
        "        self._kept.update(self.current)\n",
        "",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_load_promised_before_the_scheduler_"
                "hears_of_a_weight_transfer_never_misses"
            ),
        ),
    ),
    Mutation(
        "encoder-cache-reset-keeps-staged-items",
        "nothing staged before vLLM's encoder cache reset is loaded after it",
        "lmcache_ec/integration/vllm/scheduler.py",
        (
            '            self.give_up(identifier, now, "vLLM reset its encoder cache", '
            "fetch_failed=False)\n"
        ),
        "            pass\n",
        (
            (
                "tests/vllm/test_weight_seams.py::test_nothing_staged_before_an_encoder_cach"
                "e_reset_is_loaded_after_it"
            ),
        ),
    ),
    Mutation(
        "fingerprint-failure-skips-the-gather",
        "a fingerprint failing on one tensor-parallel rank fails on all, none left in the gather",
        "lmcache_ec/integration/vllm/weights.py",
        "        digest, error = bytes(8 * _DIGEST_WORDS), exc\n",
        "        raise\n",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_fingerprint_failing_on_one_rank_fai"
                "ls_on_every_rank_and_none_waits"
            ),
        ),
    ),
    Mutation(
        "model-reached-outside-the-gather",
        "a rank whose model cannot be reached still joins its peers' fingerprint gather",
        "lmcache_ec/integration/vllm/connector.py",
        "                else self._weights_version(weights_fingerprint(model, tp_gather()))\n",
        "                else self._weights_version(weights_fingerprint(model(), tp_gather()))\n",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_rank_whose_model_cannot_be_reached_"
                "still_joins_the_gather"
            ),
        ),
    ),
    Mutation(
        "saves-reported-across-an-update",
        "a save landed under the old weights is never reported under the new ones",
        "lmcache_ec/integration/vllm/worker.py",
        "            self._saved.clear()\n",
        "",
        (
            (
                "tests/vllm/test_weight_seams.py::test_a_save_landed_under_the_old_weights_i"
                "s_not_reported_under_the_new"
            ),
        ),
    ),
    Mutation(
        "timeline-open-waits-for-a-fifo-reader",
        "a timeline_path that is a FIFO without a reader never blocks the scheduler's step",
        "lmcache_ec/integration/vllm/timeline.py",
        "_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK\n",
        "_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT\n",
        (
            (
                "tests/vllm/test_timeline_sinks.py::test_a_fifo_without_a_reader_turns_the_t"
                "imeline_off_without_blocking_the_scheduler"
            ),
        ),
    ),
    Mutation(
        "timeline-writes-to-any-file-type",
        "a timeline_path that is no regular file (a FIFO, a device) is off with one warning",
        "lmcache_ec/integration/vllm/timeline.py",
        (
            "            if not stat.S_ISREG(mode):  # a write to it could block the engine step\n"
            '                raise OSError(f"not a regular file ({_kind(mode)})")\n'
        ),
        "",
        (
            (
                "tests/vllm/test_timeline_sinks.py::test_a_fifo_whose_reader_stopped_reading"
                "_never_blocks_a_worker_step"
            ),
            (
                "tests/vllm/test_timeline_sinks.py::test_a_character_device_is_refused_with_"
                "one_warning"
            ),
        ),
    ),
    Mutation(
        "timeline-open-unlocked",
        "threads writing their first timeline lines at once open the file once",
        "lmcache_ec/integration/vllm/timeline.py",
        "        self._lock = threading.Lock()\n",
        '        self._lock = __import__("contextlib").nullcontext()\n',
        (
            (
                "tests/vllm/test_timeline_sinks.py::test_threads_writing_their_first_lines_a"
                "t_once_open_the_file_once"
            ),
        ),
    ),
    Mutation(
        "timeline-never-reopens-after-rotation",
        "a timeline renamed away or removed goes on in a new file at its path",
        "lmcache_ec/integration/vllm/timeline.py",
        (
            "                if self._fd is not None and self._rotated():\n"
            "                    self._close()\n"
        ),
        "",
        (
            (
                "tests/vllm/test_timeline_sinks.py::test_a_rotated_timeline_goes_on_in_a_new"
                "_file_at_the_path[rename-and-create]"
            ),
            (
                "tests/vllm/test_timeline_sinks.py::test_a_rotated_timeline_goes_on_in_a_new"
                "_file_at_the_path[rename]"
            ),
            (
                "tests/vllm/test_timeline_sinks.py::test_a_rotated_timeline_goes_on_in_a_new"
                "_file_at_the_path[remove]"
            ),
        ),
    ),
    Mutation(
        "doctor-unlistable-disk-traceback",
        "doctor on a disk directory it can write but not list: a fail row, no traceback",
        "lmcache_ec/cli/doctor.py",
        "        free = shutil.disk_usage(directory).free\n    except OSError as exc:\n",
        "        free = shutil.disk_usage(directory).free\n    except ImportError as exc:\n",
        (
            (
                "tests/cli/test_doctor_inputs.py::test_doctor_reports_a_disk_directory_it_ca"
                "n_write_but_not_list"
            ),
        ),
    ),
    Mutation(
        "doctor-lists-a-dependency-per-extra",
        "doctor's version check names a dependency several extras need once",
        "lmcache_ec/cli/doctor.py",
        "        name = canonicalize_name(req.name)\n",
        "        name = canonicalize_name(req.name) + str(extra)\n",
        (
            (
                "tests/cli/test_doctor_inputs.py::test_doctor_lists_a_dependency_several_ext"
                "ras_name_once"
            ),
        ),
    ),
    Mutation(
        "metrics-register-a-collector-per-call",
        "register() once per cache on one registry: no Duplicated timeseries, each family once",
        "lmcache_ec/metrics_export.py",
        "        collector = _COLLECTORS.get(registry)\n",
        "        collector = None\n",
        (
            (
                "tests/test_metrics_export_registry.py::test_caches_of_several_models_regist"
                "er_one_by_one_on_one_registry[checks-names]"
            ),
            (
                "tests/test_metrics_export_registry.py::test_caches_of_several_models_regist"
                "er_one_by_one_on_one_registry[plain]"
            ),
        ),
    ),
    Mutation(
        "metrics-series-of-one-label-set-not-summed",
        "caches of one model and namespace make one series, their counters summed",
        "lmcache_ec/metrics_export.py",
        "    series[labels] = series.get(labels, 0) + value\n",
        "    series[labels] = value\n",
        (
            (
                "tests/test_metrics_export_registry.py::test_caches_of_one_model_and_namespa"
                "ce_make_one_series_summed"
            ),
        ),
    ),
    Mutation(
        "metrics-histograms-of-one-label-set-not-summed",
        "caches of one model and namespace make one histogram, their buckets summed",
        "lmcache_ec/metrics_export.py",
        "                buckets[bound] = buckets.get(bound, 0) + count\n",
        "                buckets[bound] = count\n",
        (
            (
                "tests/test_metrics_export_registry.py::test_caches_of_one_model_and_namespa"
                "ce_make_one_series_summed"
            ),
        ),
    ),
    Mutation(
        "metrics-tier-available-if-any-cache-has-it",
        "a tier failing in one cache of a label set is exported unavailable",
        "lmcache_ec/metrics_export.py",
        (
            "            self.available[(*labels, tier)] = min(up, "
            "self.available.get((*labels, tier), up))\n"
        ),
        "            self.available[(*labels, tier)] = up\n",
        (
            (
                "tests/test_metrics_export_registry.py::test_a_tier_failing_in_one_cache_of_"
                "a_label_set_is_unavailable"
            ),
        ),
    ),
    Mutation(
        "metrics-cache-added-twice",
        "a cache registered twice is counted once",
        "lmcache_ec/metrics_export.py",
        (
            "            if not any(c is cache for c in self._caches):\n"
            "                self._caches.append(cache)\n"
        ),
        "            self._caches.append(cache)\n",
        ("tests/test_metrics_export_registry.py::test_a_cache_registered_twice_is_counted_once",),
    ),
    Mutation(
        "stats-metrics-url-read-unbounded",
        "stats --metrics-url at a server trickling its answer gives up at its deadline, exit 1",
        "lmcache_ec/cli/entries.py",
        "    reader.join(SCRAPE_DEADLINE_S)\n",
        "    reader.join()\n",
        (
            (
                "tests/cli/test_entries_inputs.py::test_stats_gives_up_on_a_metrics_endpoint"
                "_that_trickles_its_answer"
            ),
        ),
    ),
    Mutation(
        "stats-metrics-page-size-unchecked",
        "stats --metrics-url reads no page past its size limit, exit 1",
        "lmcache_ec/cli/entries.py",
        (
            "    if len(body) > SCRAPE_MAX_BYTES:\n"
            '        raise OSError(f"the answer is larger than '
            '{human_bytes(SCRAPE_MAX_BYTES)}")\n'
        ),
        "",
        (
            (
                "tests/cli/test_entries_inputs.py::test_stats_reads_no_metrics_page_past_its"
                "_size_limit"
            ),
        ),
    ),
    Mutation(
        "stats-unlisted-remote-shown-empty",
        "stats leaves out a remote tier it could not list, never 0 entries",
        "lmcache_ec/cli/entries.py",
        '    if session.catalog is not None and "remote" not in session.skipped:\n',
        "    if session.catalog is not None:\n",
        (
            (
                "tests/cli/test_entries_inputs.py::test_stats_leaves_out_a_remote_tier_it_co"
                "uld_not_list"
            ),
        ),
    ),
    Mutation(
        "ls-negative-limit-taken",
        "ls --limit below 0 is a usage error (exit 2)",
        "lmcache_ec/cli/entries.py",
        (
            '    limit: Annotated[int, typer.Option(min=0, help="Show at most this many '
            'entries (0: all).")] = 0,\n'
        ),
        (
            '    limit: Annotated[int, typer.Option(help="Show at most this many entries '
            '(0: all).")] = 0,\n'
        ),
        ("tests/cli/test_entries_inputs.py::test_ls_refuses_a_negative_limit",),
    ),
    Mutation(
        "upload-not-bounded-as-a-whole",
        "a write whose reply drips is given up within remote_timeout + 0.5 s and cut",
        "lmcache_ec/remote/lmcache_connector.py",
        (
            "            sent = self._bound.run(\n"
            "                self._send_unless_stored, key.to_string(), memory_obj, "
            "late=_release(memory_obj)\n"
            "            )\n"
        ),
        "            sent = self._send_unless_stored(key.to_string(), memory_obj)\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_write_whose_reply_drips_is_gi"
                "ven_up_and_cut_within_the_bound"
            ),
        ),
    ),
    Mutation(
        "remote-threads-hold-the-exit",
        "a call nobody can cut (S3) never keeps the process from exiting",
        "lmcache_ec/remote/deadline.py",
        "                threading.Thread(target=self._work, name=name, daemon=True).start()\n",
        "                threading.Thread(target=self._work, name=name).start()\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_process_whose_upload_drips_wh"
                "en_it_closes_exits[s3]"
            ),
        ),
    ),
    Mutation(
        "closed-pool-runs-queued-uploads",
        "uploads not started when the tier closes are cancelled (their buffers released)",
        "lmcache_ec/remote/deadline.py",
        "                job[0].cancel()\n",
        "                pass\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_closed_pool_cancels_the_uploa"
                "ds_it_had_not_started"
            ),
        ),
    ),
    Mutation(
        "catalog-listing-unbounded",
        "a listing whose page drips fails within the bound (ls/stats/purge: warning, exit 1)",
        "lmcache_ec/remote/catalog.py",
        (
            "        while step := self._listing_step(_take, entries, LIST_STEP):\n"
            "            yield from step\n"
        ),
        "        yield from entries\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_listing_whose_page_drips_fail"
                "s_within_the_bound[redis]"
            ),
            (
                "tests/remote/test_dripping_servers.py::test_a_listing_whose_page_drips_fail"
                "s_within_the_bound[s3]"
            ),
            (
                "tests/remote/test_dripping_servers.py::test_ls_of_a_tier_whose_listing_drip"
                "s_warns_and_exits_1"
            ),
        ),
    ),
    Mutation(
        "catalog-lookups-unbounded",
        "the scheduler's batched remote lookup answers None within the bound, never parks",
        "lmcache_ec/remote/catalog.py",
        "            return self._deadline.run(self.store.exists_many, storage_names)\n",
        "            return self.store.exists_many(storage_names)\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_lookups_whose_answer_drips_are_"
                "unanswered_within_the_bound"
            ),
        ),
    ),
    Mutation(
        "catalog-lookup-unbounded",
        "a remote lookup answers None within the bound when the store drips",
        "lmcache_ec/remote/catalog.py",
        "            return self._deadline.run(self.store.exists, storage_name)\n",
        "            return self.store.exists(storage_name)\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_lookups_whose_answer_drips_are_"
                "unanswered_within_the_bound"
            ),
        ),
    ),
    Mutation(
        "catalog-claim-unbounded",
        "a claim whose answer drips goes ahead (True) within the bound",
        "lmcache_ec/remote/catalog.py",
        (
            "                won = [self._deadline.run(self.store.claim, name, ttl_s) for "
            "name in names]\n"
        ),
        "                won = [self.store.claim(name, ttl_s) for name in names]\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_claim_and_a_delete_whose_answ"
                "er_drips_are_given_up_within_the_bound"
            ),
        ),
    ),
    Mutation(
        "catalog-delete-unbounded",
        "a delete whose answer drips is False within the bound (purge never hangs)",
        "lmcache_ec/remote/catalog.py",
        "            return self._deadline.run(self.store.delete, storage_name)\n",
        "            return self.store.delete(storage_name)\n",
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_claim_and_a_delete_whose_answ"
                "er_drips_are_given_up_within_the_bound"
            ),
        ),
    ),
    Mutation(
        "s3-batch-threads-hold-the-exit",
        "an S3 batched lookup left dripping never keeps the process from exiting",
        "lmcache_ec/remote/s3_store.py",
        '            self._pool = DaemonPool(_LOOKUP_THREADS, "ec-s3-many")\n',
        (
            "            self._pool = "
            '__import__("concurrent.futures").futures.ThreadPoolExecutor(_LOOKUP_THREADS)\n'
        ),
        (
            (
                "tests/remote/test_dripping_servers.py::test_a_process_whose_batched_s3_look"
                "up_drips_exits"
            ),
        ),
    ),
    Mutation(
        "group-shared-ledger-per-user",
        "users of a group sharing a disk directory never take it past its limit",
        "lmcache_ec/tiers/budget.py",
        "        if self.layout.modes.group_shared:\n",
        "        if False:\n",
        (
            (
                "tests/tiers/test_group_shared_disk.py::test_users_of_a_group_writing_in_tur"
                "n_never_take_the_directory_past_its_limit"
            ),
        ),
    ),
    Mutation(
        "group-ledger-symlink-followed",
        "a symlink planted at a group-shared directory's ledger is never followed",
        "lmcache_ec/tiers/group_ledger.py",
        (
            "_GROUP_LEDGER_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | "
            "os.O_CLOEXEC\n"
        ),
        "_GROUP_LEDGER_OPEN = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC\n",
        (
            (
                "tests/tiers/test_group_shared_disk.py::test_a_ledger_that_is_no_file_of_the"
                "_group_is_never_used[symlink]"
            ),
        ),
    ),
    Mutation(
        "group-ledger-of-an-outsider-used",
        "a group-shared directory's ledger made by a user outside the group is never used",
        "lmcache_ec/tiers/group_ledger.py",
        "    if info.st_gid != directory.st_gid or (info.st_mode | directory.st_mode) & 0o002:\n",
        "    if False:\n",
        (
            (
                "tests/tiers/test_group_shared_disk.py::test_a_ledger_that_is_no_file_of_the"
                "_group_is_never_used[outsiders-file]"
            ),
        ),
    ),
    Mutation(
        "group-member-hit-not-recorded",
        "a hit by another user of the group keeps the entry from LRU eviction",
        "lmcache_ec/tiers/disk_layout.py",
        "            with contextlib.suppress(OSError):\n                os.utime(entry, None)\n",
        "            pass\n",
        (
            (
                "tests/tiers/test_group_shared_disk.py::test_a_hit_by_another_user_of_the_gr"
                "oup_keeps_the_entry_from_lru_eviction"
            ),
        ),
    ),
    Mutation(
        "follower-ignores-its-own-bound",
        (
            "a caller waits for another instance at most twice its own wait_s, also behind "
            "a leader of its process"
        ),
        "lmcache_ec/storage/get_or_compute.py",
        (
            "        while not flight.done.wait(_FOLLOW_POLL_S):\n"
            "            if self._waits_on_another(flight) and time.monotonic() >= deadline:\n"
            "                return False\n"
        ),
        "        flight.done.wait()\n",
        (
            (
                "tests/storage/test_get_or_compute_flights.py::test_a_follower_waits_for_ano"
                "ther_instance_no_longer_than_its_own_bound"
            ),
        ),
    ),
    Mutation(
        "follower-gives-up-on-a-compute-of-its-process",
        "threads asking for one entry share one compute, however short their wait_s",
        "lmcache_ec/storage/get_or_compute.py",
        "            if self._waits_on_another(flight) and time.monotonic() >= deadline:\n",
        "            if time.monotonic() >= deadline:\n",
        (
            (
                "tests/storage/test_get_or_compute_flights.py::test_a_follower_waits_for_a_c"
                "ompute_of_its_process_past_its_own_bound"
            ),
        ),
    ),
    Mutation(
        "computed-entries-land-after-the-batchs-wait",
        (
            "an entry computed in a batch reaches its followers before the batch waits for "
            "another instance"
        ),
        "lmcache_ec/storage/get_or_compute.py",
        (
            "            self._land(flights, won, results)  # its followers need not wait "
            "for the others\n"
        ),
        "",
        (
            (
                "tests/storage/test_get_or_compute_flights.py::test_an_entry_computed_in_a_b"
                "atch_reaches_its_followers_before_the_batchs_wait"
            ),
        ),
    ),
    Mutation(
        "hits-land-after-the-batchs-compute",
        "a compute may ask for a stored entry of its own batch",
        "lmcache_ec/storage/get_or_compute.py",
        "            self._land(flights, [h for h in hashes if h in results], results)\n",
        "",
        (
            (
                "tests/storage/test_get_or_compute_flights.py::test_a_compute_may_ask_for_a_"
                "stored_entry_of_its_own_batch"
            ),
        ),
    ),
    Mutation(
        "compute-asking-for-an-awaited-entry-waits-for-itself",
        "a compute may ask for an entry its batch waits for from another instance",
        "lmcache_ec/storage/get_or_compute.py",
        (
            "            elif self._waits_on_another(flight):\n"
            "                own.append(mm_hash)  # its flight cannot land while this "
            "thread is here\n"
        ),
        "",
        (
            (
                "tests/storage/test_get_or_compute_flights.py::test_a_compute_may_ask_for_an"
                "_entry_its_batch_waits_for_from_another_instance"
            ),
        ),
    ),
    Mutation(
        "bench-output-path-unchecked",
        "a bench --json/--markdown/--chart that cannot be written is refused when parsed (exit 2)",
        "lmcache_ec/cli/common.py",
        '    if reason:\n        raise typer.BadParameter(f"cannot write {text!r}: {reason}")\n',
        "",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_an_output_file_in_no_director"
                "y_is_refused_before_the_benchmark_runs[fingerprint--json]"
            ),
        ),
    ),
    Mutation(
        "cli-write-oserror-traceback",
        "an output file the filesystem refuses to write is one error line (exit 2)",
        "lmcache_ec/cli/common.py",
        (
            "    except OSError as exc:\n"
            '        fail(f"cannot write {path}: {exc.strerror or exc}", 2)\n'
        ),
        (
            "    except ValueError as exc:\n"
            '        fail(f"cannot write {path}: {exc.strerror or exc}", 2)\n'
        ),
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_config_doc_write_to_a_file_th"
                "at_refuses_writes_is_one_error_line"
            ),
        ),
    ),
    Mutation(
        "bench-nan-option-accepted",
        "a bench time, exponent or bandwidth that is nan or inf is refused when parsed (exit 2)",
        "lmcache_ec/cli/common.py",
        (
            "    if not math.isfinite(value):  # nan passes every comparison and prints nonsense\n"
            '        raise typer.BadParameter(f"must be a finite number, not {text!r}")\n'
        ),
        "",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_a_bandwidth_or_size_that_is_n"
                "o_finite_number_above_0_is_refused_when_parsed[--link-gbs-nan]"
            ),
        ),
    ),
    Mutation(
        "bench-zero-bandwidth-divides",
        "bench fingerprint refuses a bandwidth of 0 (exit 2), never a ZeroDivisionError",
        "lmcache_ec/cli/common.py",
        '    if value <= 0:\n        raise typer.BadParameter(f"must be > 0, not {text!r}")\n',
        "",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_a_bandwidth_or_size_that_is_n"
                "o_finite_number_above_0_is_refused_when_parsed[--gpu-bandwidth-gbs-0]"
            ),
        ),
    ),
    Mutation(
        "bench-negative-time-accepted",
        "a negative bench time is refused when parsed, not after the engine's set-up",
        "lmcache_ec/cli/common.py",
        '    if value < 0:\n        raise typer.BadParameter(f"must be >= 0, not {text!r}")\n',
        "",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_a_time_or_exponent_that_is_no"
                "_finite_number_at_least_0_is_refused_when_parsed[steps--forward-ms--1]"
            ),
        ),
    ),
    Mutation(
        "fleet-zipf-overflow",
        "bench fleet with a steep Zipf exponent draws the top image, never an OverflowError",
        "lmcache_ec/bench/fleet.py",
        "    weights = [float(rank + 1) ** -settings.zipf for rank in range(settings.images)]\n",
        "    weights = [1.0 / (rank + 1) ** settings.zipf for rank in range(settings.images)]\n",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_a_steep_zipf_draws_the_most_p"
                "opular_image_instead_of_overflowing"
            ),
        ),
    ),
    Mutation(
        "connector-times-unbounded",
        (
            "a connector time (*_s) past one day stops start-up naming it, never a crash "
            "in a scheduler step"
        ),
        "lmcache_ec/integration/vllm/connector_options.py",
        "    if name.endswith(_SECONDS_SUFFIX) and number > MAX_SECONDS:\n",
        "    if False:\n",
        (
            (
                "tests/vllm/test_connector_option_bounds.py::test_a_time_past_one_day_is_ref"
                "used_naming_the_key[idle_stage_wait_s-3000000.0]"
            ),
        ),
    ),
    Mutation(
        "connector-count-cut",
        "a connector count that is no whole number is refused, not cut",
        "lmcache_ec/integration/vllm/connector_options.py",
        "    if isinstance(number, int) and isinstance(value, float) and value != number:\n",
        "    if False:\n",
        (
            (
                "tests/vllm/test_connector_option_bounds.py::test_a_count_that_is_no_whole_n"
                "umber_is_refused_not_cut[max_pending_saves]"
            ),
        ),
    ),
    Mutation(
        "redis-db-path-rewritten",
        "a remote_url path redis-py would read as another database (/team-a, /1/2) is refused",
        "lmcache_ec/remote_names.py",
        "        _check_db_path(parsed)\n",
        "",
        (
            (
                "tests/test_config_refusals.py::test_a_redis_url_redis_py_would_rewrite_is_r"
                "efused_at_load[redis://h:6379/team-a-database number]"
            ),
        ),
    ),
    Mutation(
        "redis-port-zero-taken",
        "a Redis URL with port 0 is refused, never taken as 6379",
        "lmcache_ec/remote_names.py",
        "        if _port_of(parsed) == 0:  # redis-py takes port 0 for 6379\n",
        "        if _port_of(parsed) == -1:\n",
        (
            (
                "tests/test_config_refusals.py::test_a_redis_url_redis_py_would_rewrite_is_r"
                "efused_at_load[redis://h:0-port 0]"
            ),
        ),
    ),
    Mutation(
        "redis-unknown-url-option",
        "a Redis URL option its connection does not take is refused at load, not at every connect",
        "lmcache_ec/remote_names.py",
        "        if name not in taken:\n",
        "        if False:\n",
        (
            (
                "tests/test_config_refusals.py::test_a_redis_url_option_its_connection_does_"
                "not_take_is_refused_at_load[redis://h:6379?foo=bar]"
            ),
        ),
    ),
    Mutation(
        "key-spelled-twice-dropped",
        "one key spelled twice in one source (ec.x and ec_x, x and X) is refused naming both",
        "lmcache_ec/config.py",
        "    if name in found:\n",
        "    if False:\n",
        (
            (
                "tests/test_config_refusals.py::test_one_key_spelled_twice_in_one_file_is_re"
                "fused_naming_both[section-and-prefix]"
            ),
        ),
    ),
    Mutation(
        "file-url-empty-is-cwd",
        "local_disk file:// (no path) is refused, never the working directory",
        "lmcache_ec/config.py",
        '    if not path:  # realpath("") is the working directory: entries would land there\n',
        "    if False:\n",
        (
            (
                "tests/test_config_refusals.py::test_a_file_url_with_no_path_is_refused_not_"
                "taken_as_the_working_directory"
            ),
        ),
    ),
    Mutation(
        "remote-delete-failure-counted-as-absent",
        "a purge whose remote deletes fail says so and exits 1, never 'stop serving'",
        "lmcache_ec/purge/inventory.py",
        "        return bool(catalog.delete(entry.name, strict=True))\n",
        "        return bool(catalog.delete(entry.name))\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_whose_remote_deletes_fail_"
                "exits_1_and_claims_nothing"
            ),
        ),
    ),
    Mutation(
        "remote-delete-failure-swallowed",
        "a strict delete raises a store failure and answers False for a missing entry",
        "lmcache_ec/remote/catalog.py",
        '            if strict:  # the caller reports it (a purge: "cannot delete", exit 1)\n',
        "            if False:\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_strict_delete_raises_a_store_fai"
                "lure_and_answers_false_for_a_missing_entry"
            ),
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_whose_remote_deletes_fail_"
                "exits_1_and_claims_nothing"
            ),
        ),
    ),
    Mutation(
        "replay-takes-seen-for-applied",
        "a replay waits for a purge the watch thread is still applying",
        "lmcache_ec/purge/follow.py",
        "            if not self.watch.wait_applied(self._config.close_timeout + APPLY_WAIT_S):\n",
        "            if False:\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_replay_waits_for_the_purge_the_w"
                "atch_thread_is_still_applying"
            ),
        ),
    ),
    Mutation(
        "purge-skips-namespaces-with-a-disk-log",
        "a purge without --namespace records in every namespace with a disk purge log",
        "lmcache_ec/cli/purge_entries.py",
        (
            "            if marker.namespace is None:\n"
            "                namespaces = {name: None for name in "
            "disk_log_slugs(directory)} | namespaces\n"
        ),
        "            pass\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_without_namespace_records_"
                "in_each_namespace_with_a_disk_log"
            ),
        ),
    ),
    Mutation(
        "untold-namespaces-not-named",
        "a purge whose record failed names the untold namespaces and the command that tells them",
        "lmcache_ec/cli/purge_entries.py",
        "    if commands:\n",
        "    if False:\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_whose_record_failed_names_"
                "the_untold_namespaces_and_how_to_tell_them"
            ),
        ),
    ),
    Mutation(
        "future-purge-record-accepted",
        "a record dated more than FUTURE_LIMIT_S ahead of the reader's clock is rejected",
        "lmcache_ec/purge/marker.py",
        "        if when > now + FUTURE_LIMIT_S:\n",
        "        if False:\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_record_dated_a_day_ahead_purges_"
                "nothing_written_after_it"
            ),
            (
                "tests/purge/test_purge_outcomes.py::test_a_record_a_little_ahead_of_the_clo"
                "ck_is_clamped_and_one_far_ahead_rejected"
            ),
        ),
    ),
    Mutation(
        "metrics-url-credentials-printed",
        "stats --metrics-url with credentials is refused without printing its password",
        "lmcache_ec/cli/entries.py",
        '    if metrics_url and "@" in metrics_url.partition("://")[2].partition("/")[0]:\n',
        "    if False:\n",
        (
            (
                "tests/cli/test_invalid_inputs.py::test_a_metrics_url_with_credentials_is_re"
                "fused_without_printing_its_password[http://admin:s3cretPW@h:abc/metrics]"
            ),
        ),
    ),
    Mutation(
        "cpu-backend-gauges-keep-the-pool",
        "a closed cache gives its CPU pool back (the CPU backend's upstream gauges)",
        "lmcache_ec/tiers/local_cpu.py",
        "    def _setup_metrics(self) -> None:\n",
        "    def _upstream_gauges_skipped(self) -> None:\n",
        (
            (
                "tests/storage/test_pool_freed_at_close.py::test_a_closed_cache_gives_its_cp"
                "u_pool_back"
            ),
        ),
    ),
    Mutation(
        "manager-gauges-keep-the-pool",
        "a closed cache gives its CPU pool back (the storage manager's upstream gauges)",
        "lmcache_ec/storage/manager.py",
        "    def _setup_metrics(self) -> None:\n",
        "    def _upstream_gauges_skipped(self) -> None:\n",
        (
            (
                "tests/storage/test_pool_freed_at_close.py::test_a_closed_cache_gives_its_cp"
                "u_pool_back"
            ),
        ),
    ),
    Mutation(
        "load-room-freed-when-scheduled",
        (
            "a load frees its room in flight once its step ran: the next staging is never "
            "refused for the loaded copy"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        (
            "            self.prefetch.take_waiters(identifier)  # its room is freed once "
            "the step ran\n"
        ),
        (
            "            self.prefetch.done(identifier)\n"
            "            self.prefetch.take_waiters(identifier)\n"
        ),
        (
            (
                "tests/vllm/test_staged_memory_bound.py::test_requests_beyond_the_staged_mem"
                "ory_bound_load_in_turn_and_never_fail[v1]"
            ),
            (
                "tests/vllm/test_staged_memory_bound.py::test_requests_beyond_the_staged_mem"
                "ory_bound_load_in_turn_and_never_fail[v2]"
            ),
        ),
    ),
    Mutation(
        "read-copy-refused-while-a-load-runs",
        "a read copy waits (bounded) for a running step's load to free worker memory",
        "lmcache_ec/integration/vllm/worker.py",
        "                if tensor is not None and not self.staged.fits(tensor):\n",
        "                if False:\n",
        (
            (
                "tests/vllm/test_staged_memory_bound.py::test_a_read_copy_waits_for_a_runnin"
                "g_steps_load_to_free_worker_memory"
            ),
        ),
    ),
    Mutation(
        "failed-request-looked-at-again",
        (
            "a staging that fails on an ec_consumer fails its request once, not re-ordered "
            "in a loop within the step"
        ),
        "lmcache_ec/integration/vllm/request_waits.py",
        (
            "        while wait.request_id not in self._failing:  # failed: vLLM ends it, "
            "nothing to look at\n"
        ),
        "        while True:\n",
        (
            (
                "tests/vllm/test_staged_memory_bound.py::test_a_staging_that_fails_on_a_cons"
                "umer_is_read_once_and_logged_once"
            ),
        ),
    ),
    Mutation(
        "stage-wait-takes-a-descriptor",
        (
            "the scheduler waits for the workers' answers at its descriptor limit (no "
            "EMFILE out of schedule())"
        ),
        "lmcache_ec/integration/vllm/stage_client.py",
        (
            "        poller.poll(max(0, math.ceil(seconds * 1000)))  # never negative: "
            "that waits for good\n"
        ),
        (
            '        with __import__("selectors").DefaultSelector():\n'
            "            poller.poll(max(0, math.ceil(seconds * 1000)))\n"
        ),
        (
            (
                "tests/chaos/test_stage_channel_faults.py::test_the_scheduler_waits_for_answ"
                "ers_at_its_descriptor_limit"
            ),
        ),
    ),
    Mutation(
        "no-home-stops-the-start",
        (
            "a user without a cache directory gets the embedded default without a disk "
            "tier, never an engine that cannot start"
        ),
        "lmcache_ec/config.py",
        (
            "    except (RuntimeError, KeyError, OSError) as exc:\n"
            '        logger.warning("No disk tier by default: no cache directory for this '
            'user (%s)", exc)\n'
        ),
        (
            "    except ZeroDivisionError as exc:\n"
            '        logger.warning("No disk tier by default: no cache directory for this '
            'user (%s)", exc)\n'
        ),
        (
            (
                "tests/test_config.py::test_a_user_without_a_home_gets_the_embedded_default_"
                "without_a_disk_tier"
            ),
        ),
    ),
    Mutation(
        "worker-close-waits-close-timeout-per-step",
        (
            "the worker connector's close (saves, staging thread, cache) returns within "
            "one close_timeout"
        ),
        "lmcache_ec/integration/vllm/worker.py",
        "            return max(deadline - time.monotonic(), 0.0)\n",
        "            return self.cache.config.close_timeout\n",
        (
            (
                "tests/vllm/test_worker_close_bound.py::test_a_worker_with_every_wait_stuck_"
                "closes_within_one_close_timeout"
            ),
        ),
    ),
    Mutation(
        "save-queue-close-waits-twice",
        "SaveQueue.close waits for its saves and its thread within one timeout",
        "lmcache_ec/integration/vllm/saver.py",
        "        self._thread.join(max(deadline - time.monotonic(), 0.0))\n",
        "        self._thread.join(timeout)\n",
        (
            (
                "tests/vllm/test_worker_close_bound.py::test_a_save_queue_with_a_stuck_put_c"
                "loses_within_its_timeout"
            ),
        ),
    ),
    Mutation(
        "cache-close-ignores-its-timeout",
        "ECCache.close(timeout=...) flushes and stops the tiers within that timeout",
        "lmcache_ec/engine.py",
        "        bound = self.config.close_timeout if timeout is None else max(timeout, 0.0)\n",
        "        bound = self.config.close_timeout\n",
        (
            (
                "tests/vllm/test_worker_close_bound.py::test_a_cache_closed_with_a_timeout_w"
                "aits_no_longer_than_it"
            ),
        ),
    ),
    Mutation(
        "full-node-dir-stops-disk-writes",
        (
            "a full node_dir (the ledgers' filesystem) never stops the disk tier: the "
            "ledger becomes this process's own, said once"
        ),
        "lmcache_ec/tiers/budget.py",
        "        if self._shared_in is None or exc.errno not in LEDGER_FULL:\n",
        "        if True:\n",
        (
            (
                "tests/tiers/test_full_node_dir_ledger.py::test_a_full_node_dir_leaves_the_d"
                "isk_tier_storing_within_its_limit"
            ),
            (
                "tests/tiers/test_full_node_dir_ledger.py::test_a_shared_ledger_failing_at_a"
                "_write_costs_that_write_only"
            ),
        ),
    ),
    Mutation(
        "fresh-ledger-room-not-held",
        (
            "a fresh ledger with no room shows at its first lock (one warning), not at the "
            "start-up trim and each write"
        ),
        "lmcache_ec/tiers/budget.py",
        "                    if os.fstat(fd).st_nlink and self._room_held(fd):\n",
        "                    if os.fstat(fd).st_nlink:\n",
        (
            (
                "tests/tiers/test_full_node_dir_ledger.py::test_a_full_node_dir_leaves_the_d"
                "isk_tier_storing_within_its_limit"
            ),
        ),
    ),
    Mutation(
        "ledger-write-failure-fails-every-write",
        "a shared ledger that fails at a later write costs that write only, not every write",
        "lmcache_ec/tiers/budget.py",
        (
            "            self._stop_sharing(exc)  # node_dir full: the next lock takes a "
            "ledger of our own\n"
        ),
        "",
        (
            (
                "tests/tiers/test_full_node_dir_ledger.py::test_a_shared_ledger_failing_at_a"
                "_write_costs_that_write_only"
            ),
        ),
    ),
    Mutation(
        "prefault-window-inside-a-page",
        (
            "a prefault window ending inside a page never ends the prefault (the window is "
            "kept to whole pages)"
        ),
        "lmcache_ec/tiers/allocator.py",
        "        target = min(self._end, -(-(self._base + end + self._ahead) // _PAGE) * _PAGE)\n",
        "        target = min(self._end, self._base + end + self._ahead)\n",
        (
            (
                "tests/tiers/test_pool_prefault.py::test_a_window_ending_inside_a_page_never"
                "_ends_the_prefault"
            ),
        ),
    ),
    Mutation(
        "lost-release-never-sent-again",
        (
            "a release a stage-channel break kept from a worker goes out again (else the "
            "worker holds that copy until the weights change)"
        ),
        "lmcache_ec/integration/vllm/worker_link.py",
        "            self._to_release[:0] = self.channel.take_lost_releases()\n",
        "            self.channel.take_lost_releases()\n",
        (
            (
                "tests/vllm/test_stage_channel_reconnect.py::test_a_release_a_channel_break_"
                "kept_from_the_worker_still_frees_its_copy"
            ),
        ),
    ),
    Mutation(
        "break-forgets-unsent-releases",
        "a break hands back the releases left unsent in the outboxes",
        "lmcache_ec/integration/vllm/stage_client.py",
        "                lost.update(dict.fromkeys(identifiers))\n",
        "                pass\n",
        (
            (
                "tests/chaos/test_stage_channel_faults.py::test_a_break_hands_back_only_the_"
                "releases_a_worker_never_got"
            ),
            (
                "tests/vllm/test_stage_channel_reconnect.py::test_a_release_a_channel_break_"
                "kept_from_the_worker_still_frees_its_copy"
            ),
        ),
    ),
    Mutation(
        "written-release-sent-again",
        (
            "a release a worker already got is not sent again after a break (it could drop "
            "a copy promised since)"
        ),
        "lmcache_ec/integration/vllm/stage_frames.py",
        (
            "            while self._tags and self._tags[0][0] <= self._written:\n"
            "                self._tags.popleft()\n"
        ),
        "",
        (
            (
                "tests/chaos/test_stage_channel_faults.py::test_a_break_hands_back_only_the_"
                "releases_a_worker_never_got"
            ),
        ),
    ),
    Mutation(
        "purge-records-only-after-deletes",
        (
            "a purge records before its deletes: killed midway, it has told every "
            "namespace it reached (a rerun finds their entries gone)"
        ),
        "lmcache_ec/cli/purge_entries.py",
        "            told = _mark_purged(session, tiers, marker, reached, rerun)\n",
        "            told = list(tiers)\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_killed_after_its_deletes_h"
                "as_told_every_namespace_it_reached"
            ),
        ),
    ),
    Mutation(
        "later-record-of-a-generation-ignored",
        (
            "a purge's record after its deletes (same generation, later time) is applied "
            "again: a read between the two may have cached an entry"
        ),
        "lmcache_ec/purge/marker.py",
        "            if newest is not None and marker.time <= newest:\n",
        "            if newest is not None:\n",
        (
            (
                "tests/purge/test_purge_log.py::test_a_generation_recorded_again_later_is_ap"
                "plied_again_and_counts_once"
            ),
            "tests/vllm/test_index_purge.py::test_disk_marker_clears_remembered_answers",
        ),
    ),
    Mutation(
        "purge-counted-per-record",
        "an engine counts one purge seen per generation, though its records are applied twice",
        "lmcache_ec/purge/follow.py",
        "        if self.watch.counts(marker.generation):  # once nothing serves the selection\n",
        "        if True:\n",
        ("tests/purge/test_purge_reach.py::test_purge_on_a_shared_disk_reaches_a_running_engine",),
    ),
    Mutation(
        "index-purge-counted-per-record",
        "the scheduler's index counts one purge seen per generation",
        "lmcache_ec/integration/vllm/index.py",
        "            self.purges_seen += self._purges.counts(marker.generation)\n",
        "            self.purges_seen += 1\n",
        ("tests/vllm/test_index_purge.py::test_disk_marker_clears_remembered_answers",),
    ),
    Mutation(
        "process-dirs-never-swept",
        "a killed process's ledger directory is removed by the user's next process",
        "lmcache_ec/runtime_dirs.py",
        "            _sweep_process_dirs()\n",
        "",
        (
            (
                "tests/chaos/test_process_dir_sweep.py::test_a_killed_process_directory_is_r"
                "emoved_by_the_next_process_and_a_live_one_is_kept"
            ),
        ),
    ),
    Mutation(
        "process-dir-sweep-removes-live",
        "the process-directory sweep never removes a live process's directory",
        "lmcache_ec/runtime_dirs.py",
        (
            "            fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "
            "BlockingIOError: it lives\n"
        ),
        "",
        (
            (
                "tests/chaos/test_process_dir_sweep.py::test_a_killed_process_directory_is_r"
                "emoved_by_the_next_process_and_a_live_one_is_kept"
            ),
        ),
    ),
    Mutation(
        "process-dir-sweep-other-users",
        "the process-directory sweep never touches another user's directory",
        "lmcache_ec/runtime_dirs.py",
        (
            "        if os.fstat(dir_fd).st_uid != os.getuid():\n"
            "            return  # another user's: never touched\n"
        ),
        "",
        (
            (
                "tests/chaos/test_process_dir_sweep.py::test_the_sweep_leaves_another_users_"
                "directory_a_symlink_and_an_older_one"
            ),
        ),
    ),
    Mutation(
        "process-dir-sweep-follows-symlinks",
        "the process-directory sweep never follows a symlink",
        "lmcache_ec/runtime_dirs.py",
        "    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)\n",
        "    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)\n",
        (
            (
                "tests/chaos/test_process_dir_sweep.py::test_the_sweep_leaves_another_users_"
                "directory_a_symlink_and_an_older_one"
            ),
        ),
    ),
    Mutation(
        "process-dir-lock-kept-by-forked-child",
        "a forked child does not keep its dead parent's process directory",
        "lmcache_ec/runtime_dirs.py",
        "    _alive_fd = close_inherited(_alive_fd)  # the parent's lock ends with the parent\n",
        "",
        (
            (
                "tests/chaos/test_process_dir_sweep.py::test_a_forked_child_that_outlives_it"
                "s_parent_does_not_keep_the_parents_directory"
            ),
        ),
    ),
    Mutation(
        "purge-log-lock-waits-for-good",
        (
            "a purge behind a stopped purger waits APPEND_LOCK_S for the purge log's lock, "
            "then names the untold namespaces (exit 1)"
        ),
        "lmcache_ec/purge/marker.py",
        '        flock_within(fd, APPEND_LOCK_S, f"the purge logs\' directory {directory}")\n',
        '        flock_within(fd, 30.0, f"the purge logs\' directory {directory}")\n',
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_purge_behind_a_stopped_purger_en"
                "ds_naming_the_untold_namespaces"
            ),
        ),
    ),
    Mutation(
        "queued-prefetch-abandoned-held-off",
        (
            "a prefetch still queued when its request ended is given up at its deadline as "
            "nothing failed (not held off the tiers for failed_retry_s)"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "        self.give_up(identifier, now, why, fetch_failed=state is S.STAGING)\n",
        "        self.give_up(identifier, now, why)\n",
        (
            (
                "tests/vllm/test_item_lifecycle.py::test_a_queued_prefetch_whose_request_end"
                "ed_is_not_held_off_the_tiers"
            ),
        ),
    ),
    Mutation(
        "pcp-workers-not-counted",
        (
            "with prefill context parallelism every first-stage worker is a rank: an item "
            "is READY only once all TP x PCP workers staged it"
        ),
        "lmcache_ec/integration/vllm/connector.py",
        "    return max(1, parallel.tensor_parallel_size) * max(1, pcp_size)\n",
        "    return max(1, parallel.tensor_parallel_size)\n",
        (
            (
                "tests/vllm/test_context_parallel.py::test_every_context_parallel_worker_lis"
                "tens_on_a_stage_socket_of_its_own"
            ),
            (
                "tests/vllm/test_context_parallel.py::test_an_item_is_ready_only_once_both_c"
                "ontext_parallel_workers_staged_it[stage_channel]"
            ),
            (
                "tests/vllm/test_context_parallel.py::test_an_item_is_ready_only_once_both_c"
                "ontext_parallel_workers_staged_it[step_metadata]"
            ),
            (
                "tests/vllm/test_context_parallel.py::test_an_entry_gone_after_one_worker_st"
                "aged_it_is_computed_not_a_crash"
            ),
        ),
    ),
    Mutation(
        "pcp-worker-numbered-by-tp-rank",
        (
            "each PCP worker has a rank of its own (pcp_rank * tp_size + tp_rank): its own "
            "stage socket and share of writes"
        ),
        "lmcache_ec/integration/vllm/connector.py",
        "        return self.pcp_rank * self.tp_size + self.tp_rank\n",
        "        return self.tp_rank\n",
        (
            (
                "tests/vllm/test_context_parallel.py::test_a_worker_is_numbered_over_the_ten"
                "sor_parallel_ranks_of_every_pcp_slice"
            ),
            (
                "tests/vllm/test_context_parallel.py::test_every_context_parallel_worker_lis"
                "tens_on_a_stage_socket_of_its_own"
            ),
            (
                "tests/vllm/test_context_parallel.py::test_one_context_parallel_worker_write"
                "s_each_item"
            ),
        ),
    ),
    Mutation(
        "pcp-rank-never-read",
        "a worker's PCP rank and size come from vLLM's PCP group",
        "lmcache_ec/integration/vllm/connector.py",
        "                *_pcp_position(),\n",
        "",
        (
            (
                "tests/vllm/test_context_parallel.py::test_a_worker_is_numbered_over_the_ten"
                "sor_parallel_ranks_of_every_pcp_slice"
            ),
        ),
    ),
    Mutation(
        "pcp-writers-count-tp-only",
        "one worker of all TP x PCP writes each item to a shared tier",
        "lmcache_ec/integration/vllm/connector.py",
        "                tp_size=position.ranks,\n",
        "                tp_size=position.tp_size,\n",
        (
            (
                "tests/vllm/test_context_parallel.py::test_one_context_parallel_worker_write"
                "s_each_item"
            ),
        ),
    ),
    Mutation(
        "pcp-listener-named-by-tp-rank",
        "each PCP worker listens on a stage socket of its own",
        "lmcache_ec/integration/vllm/connector.py",
        "                        _stage_socket(vllm_config, config.node_dir, position.rank),\n",
        "                        _stage_socket(vllm_config, config.node_dir, position.tp_rank),\n",
        (
            (
                "tests/vllm/test_context_parallel.py::test_every_context_parallel_worker_lis"
                "tens_on_a_stage_socket_of_its_own"
            ),
        ),
    ),
    Mutation(
        "staged-copy-rows-unchecked",
        (
            "a staged output of other rows than its request's placeholders is refused "
            "(vLLM's merge would raise)"
        ),
        "lmcache_ec/integration/vllm/staged_copies.py",
        "        if tensor is not None and expected and tensor.shape[0] != expected:\n",
        "        if False:\n",
        (
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_stored_output_of_other_rows_tha"
                "n_the_request_is_encoded_not_placed[v1-stage_channel]"
            ),
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_stored_output_of_other_rows_tha"
                "n_the_request_is_encoded_not_placed[v2-step_metadata]"
            ),
        ),
    ),
    Mutation(
        "stage-order-carries-no-rows",
        "a stage order over the channel carries its request's rows",
        "lmcache_ec/integration/vllm/worker_link.py",
        (
            '            and self.channel.send(dispatched, self.weights or "", '
            "self.rows_of(dispatched))\n"
        ),
        '            and self.channel.send(dispatched, self.weights or "")\n',
        (
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_stored_output_of_other_rows_tha"
                "n_the_request_is_encoded_not_placed[v1-stage_channel]"
            ),
        ),
    ),
    Mutation(
        "metadata-order-carries-no-rows",
        "a stage order in step metadata carries its request's rows",
        "lmcache_ec/integration/vllm/scheduler.py",
        "            meta.stage_rows = self.link.rows_of(meta.stage)\n",
        "",
        (
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_stored_output_of_other_rows_tha"
                "n_the_request_is_encoded_not_placed[v2-step_metadata]"
            ),
        ),
    ),
    Mutation(
        "listener-drops-order-rows",
        "the worker's listener hands an order's rows on",
        "lmcache_ec/integration/vllm/channel.py",
        (
            "                    self._on_order(list(order.ids), order.weights, link, "
            "dict(order.rows))\n"
        ),
        "                    self._on_order(list(order.ids), order.weights, link, {})\n",
        (
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_stored_output_of_other_rows_tha"
                "n_the_request_is_encoded_not_placed[v1-stage_channel]"
            ),
        ),
    ),
    Mutation(
        "request-of-other-rows-promised",
        (
            "a request with other rows than its item is fetched for fails alone, never "
            "promised the item"
        ),
        "lmcache_ec/integration/vllm/item_decisions.py",
        "        if rows and queued_rows and queued_rows != rows and state in _FETCHED:\n",
        "        if False:\n",
        (
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_request_with_other_rows_than_an"
                "_item_is_fetched_for_fails_alone[v1]"
            ),
            (
                "tests/vllm/test_reused_uuid_rows.py::test_a_request_with_other_rows_than_an"
                "_item_is_fetched_for_fails_alone[v2]"
            ),
        ),
    ),
    Mutation(
        "stage-order-rows-unchecked",
        (
            "a stage order's row counts are positive whole numbers, else the frame is bad "
            "and its link closed"
        ),
        "lmcache_ec/integration/vllm/stage_messages.py",
        '    return _read_numbers_by_id(value, name, "row counts", 1)\n',
        '    return _read_numbers_by_id(value, name, "row counts", 0)\n',
        (
            (
                "tests/chaos/test_stage_channel_faults.py::test_a_bad_frame_closes_only_its_"
                "link_on_the_worker[rows-not-positive]"
            ),
        ),
    ),
    Mutation(
        "chart-format-unchecked",
        "a --chart of a format matplotlib does not write is refused when parsed, not after the run",
        "lmcache_ec/cli/common.py",
        (
            "    if path.suffix.lower() not in CHART_SUFFIXES:\n"
            "        raise typer.BadParameter(f\"a chart is {', '.join(CHART_SUFFIXES)}, "
            'not {text!r}")\n'
        ),
        "",
        (
            (
                "tests/cli/test_bench_option_refusals.py::test_a_chart_of_a_format_matplotli"
                "b_does_not_write_is_refused_before_the_run[bench]"
            ),
            (
                "tests/cli/test_bench_option_refusals.py::test_a_chart_of_a_format_matplotli"
                "b_does_not_write_is_refused_before_the_run[serve]"
            ),
        ),
    ),
    Mutation(
        "let-through-request-leaves-step-idle",
        (
            "once a request is let through, a later request's wait in that step is held to "
            "the busy budget"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "lambda: bool(self._active or self._passed),",
        "lambda: bool(self._active),",
        (
            (
                "tests/vllm/test_stage_channel.py::test_a_request_let_through_makes_the_rest"
                "_of_its_step_busy"
            ),
        ),
    ),
    Mutation(
        "start-lists-directory-twice",
        (
            "a disk tier's start lists its directory once (the trim's listing gives the "
            "count it reports)"
        ),
        "lmcache_ec/tiers/frame_directory.py",
        "        if trimmed.kept or trimmed.evicted:\n",
        (
            "        trimmed = Trimmed(trimmed.evicted, "
            "len(self.layout.scan(reclaim=False).entries))\n"
            "        if trimmed.kept or trimmed.evicted:\n"
        ),
        ("tests/tiers/test_disk_tier.py::test_a_restart_lists_the_directory_once",),
    ),
    Mutation(
        "redis-url-option-range-unchecked",
        (
            "a Redis URL option redis-py refuses only at connect (db=-1, protocol=4, …) is "
            "a config error at load"
        ),
        "lmcache_ec/remote_names.py",
        "            _check_range(name, int(value), *_REDIS_INT_RANGES[name])\n",
        "            pass\n",
        (
            (
                "tests/test_config_inputs.py::test_redis_url_options_out_of_range_are_refuse"
                "d_at_load[protocol]"
            ),
        ),
    ),
    Mutation(
        "serve-partial-rows-dropped",
        "bench serve that stops partway still writes the rows it measured, marked stopped, exit 1",
        "lmcache_ec/bench/serve.py",
        "            stopped = str(exc)\n",
        "            raise\n",
        (
            (
                "tests/cli/test_bench_serve_partial.py::test_a_run_that_stops_partway_keeps_"
                "the_rows_it_measured"
            ),
        ),
    ),
    Mutation(
        "pool-on-default-device",
        (
            "a cache built under another default torch device keeps its pool on the host "
            "(put/get work)"
        ),
        "lmcache_ec/tiers/allocator.py",
        (
            "                _page_locked(size) if pinned else torch.empty(size, "
            'dtype=torch.uint8, device="cpu")\n'
        ),
        "                _page_locked(size) if pinned else torch.empty(size, dtype=torch.uint8)\n",
        (
            (
                "tests/test_engine.py::test_a_cache_built_under_another_default_device_keeps"
                "_its_pool_on_the_host"
            ),
        ),
    ),
    Mutation(
        "nested-tensor-taken",
        "a nested tensor is refused with a clear ValueError, never a torch RuntimeError",
        "lmcache_ec/codec.py",
        (
            "    if tensor.is_nested:  # strided in layout, but no one shape (torch fails "
            "at its bytes)\n"
            '        raise ValueError("expected one dense [tokens, hidden] tensor, got a '
            'nested tensor")\n'
        ),
        "",
        (
            (
                "tests/test_engine.py::test_bad_tensors_raise_clear_errors_and_store_nothing"
                "[value9-ValueError-nested]"
            ),
        ),
    ),
    Mutation(
        "zero-tensor-taken",
        "a ZeroTensor is refused with a clear ValueError, never a torch RuntimeError",
        "lmcache_ec/codec.py",
        '    if getattr(tensor, "_is_zerotensor", lambda: False)():\n',
        "    if False:\n",
        (
            (
                "tests/test_engine.py::test_bad_tensors_raise_clear_errors_and_store_nothing"
                "[value10-ValueError-ZeroTensor]"
            ),
        ),
    ),
    Mutation(
        "running-request-waits-again",
        (
            "a request let through waits again on none of the items it had then (chunked "
            "prefill never livelocks on the prefetch bounds)"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "                may_wait=identifier not in passed_with,\n",
        "                may_wait=True,\n",
        (
            (
                "tests/vllm/test_prefetch_bounds_chunked.py::test_a_running_request_with_mor"
                "e_stored_items_than_the_bounds_finishes[ec_both]"
            ),
        ),
    ),
    Mutation(
        "staged-item-released-while-waited-on",
        (
            "a staged item a deferred request still waits on is kept past its deadline "
            "(requests holding staged items do not take turns for ever)"
        ),
        "lmcache_ec/integration/vllm/scheduler.py",
        "        if self.prefetch.waited_on(identifier):\n",
        "        if False:\n",
        (
            (
                "tests/vllm/test_prefetch_bounds_chunked.py::test_requests_holding_staged_it"
                "ems_while_waiting_for_room_all_finish[ec_both]"
            ),
            (
                "tests/vllm/test_prefetch_bounds_chunked.py::test_requests_holding_staged_it"
                "ems_while_waiting_for_room_all_finish[ec_consumer]"
            ),
        ),
    ),
    Mutation(
        "no-room-waiters-queue-again",
        (
            "a prefetch given up for want of room is computed by every request waiting on "
            "it, not queued again"
        ),
        "lmcache_ec/integration/vllm/item_decisions.py",
        (
            "            self.owner.give_up(identifier, now, why, fetch_failed=False, "
            "waiters_compute=True)\n"
        ),
        "            self.owner.give_up(identifier, now, why, fetch_failed=False)\n",
        (
            (
                "tests/vllm/test_prefetch_bounds_chunked.py::test_requests_holding_staged_it"
                "ems_while_waiting_for_room_all_finish[ec_consumer]"
            ),
        ),
    ),
    Mutation(
        "no-room-give-up-fails-consumer",
        (
            "a prefetch never ordered for want of room fails no request on an ec_consumer: "
            "it is computed"
        ),
        "lmcache_ec/integration/vllm/item_decisions.py",
        (
            "            self.owner.give_up(identifier, now, why, fetch_failed=False, "
            "waiters_compute=True)\n"
        ),
        "            self.owner.give_up(identifier, now, why, waiters_compute=True)\n",
        (
            (
                "tests/vllm/test_prefetch_bounds_chunked.py::test_requests_holding_staged_it"
                "ems_while_waiting_for_room_all_finish[ec_consumer]"
            ),
        ),
    ),
    Mutation(
        "stats-lock-not-reentrant",
        (
            "a pool buffer the garbage collector frees inside LMCache's stats lock stalls "
            "nobody (the lock is re-entrant)"
        ),
        "lmcache_ec/tiers/allocator.py",
        "    lmcache.utils._shared_observability_lock = threading.RLock()\n",
        "    pass\n",
        (
            (
                "tests/tiers/test_pool_freed_by_gc.py::test_a_buffer_freed_by_the_collector_"
                "inside_the_stats_lock_stalls_nobody"
            ),
        ),
    ),
    Mutation(
        "unusable-device-taken",
        "a device the process cannot use, or meta, is a ValueError before any read or compute",
        "lmcache_ec/storage/copy_out.py",
        "        torch.empty(0, device=parsed)\n",
        "        pass\n",
        (
            (
                "tests/test_engine.py::test_a_device_the_process_cannot_use_is_refused_before_any"
                "_read_or_compute[mps-not usable here]"
            ),
        ),
    ),
    Mutation(
        "meta-device-hit",
        'get(device="meta") is a ValueError, never a hit with no data',
        "lmcache_ec/storage/copy_out.py",
        '    if parsed.type == "meta":',
        '    if parsed.type == "no-such-device":',
        (
            (
                "tests/test_engine.py::test_a_device_the_process_cannot_use_is_refused_before_any"
                "_read_or_compute[meta-holds no data]"
            ),
        ),
    ),
    Mutation(
        "purge-replicas-unconfirmed-silent",
        "a purge whose deletes a Redis replica has not confirmed warns and exits 1",
        "lmcache_ec/cli/purge_entries.py",
        "    if replication is not None and replication.acked < replication.replicas:\n",
        "    if False:\n",
        (
            (
                "tests/purge/test_purge_replicas.py::test_a_purge_a_replica_has_not_confirmed_war"
                "ns_and_exits_1"
            ),
        ),
    ),
    Mutation(
        "purge-waits-for-no-replica",
        "a purge on a Redis primary waits for its replicas before it ends",
        "lmcache_ec/cli/purge_entries.py",
        "                _check_replicas(session)\n",
        "                pass\n",
        (
            (
                "tests/purge/test_purge_replicas.py::test_a_purge_a_replica_has_not_confirmed_war"
                "ns_and_exits_1"
            ),
        ),
    ),
    Mutation(
        "scheduler-close-unbounded",
        (
            "the scheduler side's shutdown returns within one close_timeout with its remote threa"
            "ds stuck"
        ),
        "lmcache_ec/integration/vllm/index.py",
        "            self._thread.join(max(deadline - time.monotonic(), 0.0))\n",
        "            self._thread.join(2.0)\n",
        (
            (
                "tests/vllm/test_scheduler_io.py::test_the_scheduler_side_shuts_down_within_one_c"
                "lose_timeout"
            ),
        ),
    ),
    Mutation(
        "killed-at-shutdown-unsaid",
        (
            "a producer started with vLLM's shutdown_timeout 0 says at start that writes queued a"
            "t SIGTERM are lost"
        ),
        "lmcache_ec/integration/vllm/connector.py",
        '    if getattr(vllm_config, "shutdown_timeout", None) == 0:\n',
        "    if False:\n",
        (
            (
                "tests/vllm/test_shutdown_warning.py::test_a_producer_killed_at_shutdown_says_so_"
                "once_with_the_timeout_to_pass[ec_both]"
            ),
        ),
    ),
    Mutation(
        "killed-at-shutdown-said-by-consumer",
        "a consumer, which writes nothing, gives no shutdown_timeout warning",
        "lmcache_ec/integration/vllm/connector.py",
        "            if self.is_producer and position.rank == 0:\n",
        "            if position.rank == 0:\n",
        (
            (
                "tests/vllm/test_shutdown_warning.py::test_no_warning_with_a_shutdown_timeout_or_"
                "on_a_consumer"
            ),
        ),
    ),
    Mutation(
        "exit-loses-writes-silently",
        "a process exiting without close() says how many accepted writes it loses",
        "lmcache_ec/storage/manager.py",
        "        manager.warn_unwritten()\n",
        "        pass\n",
        (
            (
                "tests/remote/test_exit_unwritten.py::test_an_exit_without_close_says_how_many_wr"
                "ites_it_loses"
            ),
        ),
    ),
    Mutation(
        "language-embeddings-unfingerprinted",
        (
            "where the encoder output holds rows of the language model's embedding table, an upda"
            "te of that table changes the fingerprint"
        ),
        "lmcache_ec/integration/vllm/weights.py",
        "        return kept + [(n, t) for n, t in _language_embeddings(model) if id(t) in skip]\n",
        "        return kept\n",
        (
            (
                "tests/vllm/test_weights.py::test_a_language_embedding_update_changes_the_fingerp"
                "rint_where_outputs_hold_its_rows[Molmo2ForConditionalGeneration-attributes0]"
            ),
        ),
    ),
    Mutation(
        "unpruned-qwen3-vl-counts-language-embeddings",
        (
            "a Qwen3-VL without video pruning keeps its entries across a language-model update (i"
            "ts outputs hold no embedding rows)"
        ),
        "lmcache_ec/integration/vllm/weights.py",
        '        getattr(m, "is_multimodal_pruning_enabled", False)\n',
        "        True\n",
        (
            (
                "tests/vllm/test_weights.py::test_a_subclass_inherits_the_rule_and_other_models_s"
                "kip_the_language_embeddings"
            ),
        ),
    ),
    Mutation(
        "remote-code-not-in-identity",
        "a trust_remote_code model's own code is part of the encoder identity",
        "lmcache_ec/integration/vllm/identity.py",
        '        "remote_code": remote_code(model_config),\n',
        "",
        (
            (
                "tests/vllm/test_identity_inputs.py::test_remote_code_of_a_model_directory_is_par"
                "t_of_the_fingerprint"
            ),
            (
                "tests/vllm/test_identity_inputs.py::test_a_hub_models_remote_code_is_named_by_it"
                "s_snapshot"
            ),
        ),
    ),
    Mutation(
        "library-releases-not-in-identity",
        (
            "another vLLM or transformers release, or transformers without torchvision, gives ano"
            "ther encoder identity"
        ),
        "lmcache_ec/integration/vllm/identity.py",
        '        "code": code_versions(),\n',
        "",
        (
            (
                "tests/vllm/test_identity_inputs.py::test_another_release_of_vllm_or_transformers"
                "_changes_the_fingerprint[transformers]"
            ),
            (
                "tests/vllm/test_identity_inputs.py::test_transformers_falling_back_to_its_pil_pr"
                "ocessors_changes_the_fingerprint"
            ),
        ),
    ),
    Mutation(
        "hub-remote-code-by-revision-only",
        (
            "a hub model's remote code is named by the snapshot it is read from, not the revision"
            " asked for"
        ),
        "lmcache_ec/integration/vllm/identity.py",
        (
            '    return {"snapshot": snapshot or str(revision or ""), "code_revision": str(code_r'
            "evision)}\n"
        ),
        '    return {"snapshot": str(revision or ""), "code_revision": str(code_revision)}\n',
        (
            (
                "tests/vllm/test_identity_inputs.py::test_a_hub_models_remote_code_is_named_by_it"
                "s_snapshot"
            ),
        ),
    ),
    Mutation(
        "cluster-listing-ignores-slot-moves",
        (
            "a Redis Cluster listing fails when slots moved during it (a purge would leave the mo"
            "ved entries, served)"
        ),
        "lmcache_ec/remote/redis_cluster.py",
        "        if self._slot_owners() != before:\n",
        "        if False:\n",
        ("tests/cluster/test_cluster_topology.py::test_a_slot_moved_during_a_listing_fails_it",),
    ),
    Mutation(
        "cluster-listing-during-migration",
        "a Redis Cluster listing fails while a slot is being moved",
        "lmcache_ec/remote/redis_cluster.py",
        '            if mine is None or mine["migrations"]:\n',
        "            if mine is None:\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_listing_while_a_slot_is_being_mov"
                "ed_fails_rather_than_miss_entries"
            ),
        ),
    ),
    Mutation(
        "replay-claims-lost-writes-re-sent",
        "after an outage, writes no local tier holds are said lost, never counted as re-sent",
        "lmcache_ec/storage/replay.py",
        "            if resent:\n",
        "            if keys:\n",
        (
            (
                "tests/faults/test_remote_recovery.py::test_writes_no_local_tier_holds_are_said_l"
                "ost_not_re_sent"
            ),
        ),
    ),
    Mutation(
        "clusterdown-takes-the-tier-down",
        "a cluster node answering CLUSTERDOWN is its shard down: the other shards keep hitting",
        "lmcache_ec/remote/redis_cluster.py",
        "        if refused is not None:\n",
        "        if False:\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_node_answering_clusterdown_is_its"
                "_shard_down_not_the_tier"
            ),
        ),
    ),
    Mutation(
        "sentinel-failover-not-followed",
        (
            "after a planned Sentinel failover, writes go to the new primary (the pool's connecti"
            "ons to the old one are closed)"
        ),
        "lmcache_ec/remote/sentinel_watch.py",
        (
            "            self._pool.disconnect()  # in use too: the old primary may drop what the"
            "y write\n"
        ),
        "            pass\n",
        (
            (
                "tests/remote/test_sentinel.py::test_after_a_planned_failover_writes_go_to_the_ne"
                "w_primary"
            ),
        ),
    ),
    Mutation(
        "cluster-hung-shard-tried-by-every-caller",
        (
            "after a shard failed, callers skip it and one background ping tries it again; no cal"
            "ler waits on it"
        ),
        "lmcache_ec/remote/redis_cluster.py",
        "            if time.monotonic() >= down:\n                self._try_shard(node)\n",
        (
            "            if time.monotonic() >= down:  # every caller tries it\n                se"
            "lf._down_until.pop(node.name, None)\n                self._returning.add(node.name)\n "
            "               return self._client_of(node)\n"
        ),
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_hung_shard_holds_no_caller_after_"
                "its_first_failure"
            ),
        ),
    ),
    Mutation(
        "cluster-answered-ping-keeps-the-shard-down",
        "a down shard whose ping answers is used again",
        "lmcache_ec/remote/redis_cluster.py",
        (
            "            if self._down_until.pop(node.name, None) is not None:\n                se"
            "lf._returning.add(node.name)\n"
        ),
        "            pass\n",
        (
            (
                "tests/cluster/test_cluster_topology.py::test_a_hung_shard_holds_no_caller_after_"
                "its_first_failure"
            ),
        ),
    ),
    Mutation(
        "s3-damage-in-transit-deletes-the-entry",
        (
            "an S3 answer that is not the stored object (another entry's bytes, a cut body) is a "
            "miss; the good entry stays in the bucket"
        ),
        "lmcache_ec/storage/reads.py",
        "                    tier.remove_damaged(key)\n",
        "                    tier.remove(key)\n",
        (
            (
                "tests/remote/test_s3_answers.py::test_an_answer_that_is_not_the_stored_entry_is_"
                "a_miss_and_the_entry_stays[another-entry]"
            ),
            (
                "tests/remote/test_s3_answers.py::test_an_answer_that_is_not_the_stored_entry_is_"
                "a_miss_and_the_entry_stays[cut-body]"
            ),
        ),
    ),
    Mutation(
        "s3-document-answer-taken-for-an-entry",
        (
            "an S3 read answered with a document (a gateway's error page, status 200) is a failed"
            " call, not a damaged entry"
        ),
        "lmcache_ec/remote/s3_store.py",
        "        if any(kind in content_type for kind in _DOCUMENT_TYPES):\n",
        "        if False:\n",
        (
            (
                "tests/remote/test_s3_answers.py::test_an_answer_that_is_not_the_stored_entry_is_"
                "a_miss_and_the_entry_stays[error-page]"
            ),
        ),
    ),
    Mutation(
        "s3-confirmed-damage-kept",
        "an S3 entry whose stored bytes are damaged is removed",
        "lmcache_ec/remote/s3_store.py",
        '        if read != (str(stored.get("ETag", "")), int(stored["ContentLength"])):\n',
        "        if True:\n",
        (
            (
                "tests/faults/test_corruption.py::test_damaged_remote_entry_is_a_miss_and_is_remo"
                "ved[s3-flip-payload]"
            ),
            (
                "tests/faults/test_corruption.py::test_damaged_remote_entry_is_a_miss_and_is_remo"
                "ved[s3-truncate]"
            ),
        ),
    ),
    Mutation(
        "s3-probe-keeps-old-credentials",
        "credentials rewritten while the S3 tier is down are used by its next probe",
        "lmcache_ec/remote/s3_store.py",
        (
            "            old, self._client = self._client, make_client(self.settings)\n           "
            " old.close()\n"
        ),
        "            pass\n",
        (
            (
                "tests/remote/test_s3_answers.py::test_credentials_rewritten_while_the_tier_is_do"
                "wn_are_used_by_its_probe"
            ),
        ),
    ),
    Mutation(
        "purge-cut-off-without-clock-skew",
        (
            "an engine applying a purge purges entries of a writer whose clock runs up to 60 s ah"
            "ead of the purger's"
        ),
        "lmcache_ec/purge/marker.py",
        "            created_before=self.time + CLOCK_SKEW_S - (self.older_than or 0.0),\n",
        "            created_before=self.time - (self.older_than or 0.0),\n",
        (
            (
                "tests/purge/test_purge_reach.py::test_entries_of_a_writer_whose_clock_runs_ahead"
                "_are_purged"
            ),
        ),
    ),
    Mutation(
        "ls-unread-headers-exit-0",
        "ls whose remote header reads the store refused says so and exits 1",
        "lmcache_ec/cli/entries.py",
        "    if unread:  # the store failed these reads: the listing is not what it holds\n",
        "    if False:\n",
        (
            (
                "tests/cli/test_damaged_listing.py::test_ls_whose_header_reads_the_store_refuses_"
                "exits_1"
            ),
        ),
    ),
    Mutation(
        "redis-wrong-type-header-read-taken-for-a-failure",
        "a Redis key of another type is a damaged entry to ls and purge, not a store failure",
        "lmcache_ec/remote/redis_store.py",
        "        present, data = pipe.execute(raise_on_error=False)\n",
        "        present, data = pipe.execute()\n",
        (
            (
                "tests/cli/test_damaged_listing.py::test_a_redis_key_of_another_type_is_listed_as"
                "_one_unreadable_entry"
            ),
        ),
    ),
    Mutation(
        "s3-throttle-takes-the-tier-down",
        "a call S3 refuses for now (SlowDown, 503) is a miss; the tier stays available",
        "lmcache_ec/remote/s3_store.py",
        "        if not _is_busy(exc):\n",
        "        if True:\n",
        (
            (
                "tests/remote/test_s3_answers.py::test_a_throttled_read_is_a_miss_and_the_tier_st"
                "ays_available"
            ),
        ),
    ),
    Mutation(
        "s3-probe-passes-when-reads-are-denied",
        "an S3 store refusing every read stays down (one warning), never back at each probe",
        "lmcache_ec/remote/s3_store.py",
        "                self._client.head_object(**self._object(_PROBE_NAME))\n",
        "                pass\n",
        (
            (
                "tests/remote/test_s3_answers.py::test_a_store_refusing_every_read_stays_down_and"
                "_says_so_once"
            ),
        ),
    ),
    Mutation(
        "writer-thread-published-before-it-runs",
        "a disk write whose thread cannot start is skipped; the next write starts it and lands",
        "lmcache_ec/tiers/writer.py",
        (
            "            thread = threading.Thread(target=self._run, name=self._name, daemon=True"
            ")\n            try:\n"
        ),
        (
            "            thread = self._thread = threading.Thread(target=self._run, name=self._na"
            "me, daemon=True)\n            try:\n"
        ),
        (
            (
                "tests/faults/test_thread_limits.py::test_a_disk_write_whose_thread_cannot_start_"
                "is_skipped_and_the_next_lands"
            ),
        ),
    ),
    Mutation(
        "promotion-thread-failure-raised",
        "a disk hit whose promotion thread cannot start is served",
        "lmcache_ec/storage/promotion.py",
        (
            "                try:\n                    thread.start()\n                except Runti"
            "meError:  # no thread now (a pids limit): skipped, tried next time\n                 "
            "   return False\n"
        ),
        "                thread.start()\n",
        (
            (
                "tests/faults/test_thread_limits.py::test_a_disk_hit_whose_promotion_thread_canno"
                "t_start_is_served"
            ),
        ),
    ),
    Mutation(
        "remote-thread-failure-takes-the-tier-down",
        "a remote read whose thread cannot start is a miss (reads_busy), not an outage",
        "lmcache_ec/remote/deadline.py",
        (
            "                try:\n                    threading.Thread(target=self._work, name=na"
            "me, daemon=True).start()\n                    self._started += 1\n                exce"
            "pt RuntimeError as exc:  # no thread now (a pids limit)\n                    if self."
            "_started == 0:  # none to take the call: it never runs\n                        futu"
            "re.cancel()\n                        raise "
            'ReadersBusy(f"no thread to run it: {exc}") from exc\n'
        ),
        (
            "                threading.Thread(target=self._work, name=name, daemon=True).start()\n"
            "                self._started += 1\n"
        ),
        (
            (
                "tests/faults/test_thread_limits.py::test_a_remote_read_whose_thread_cannot_start"
                "_is_a_miss_not_an_outage"
            ),
        ),
    ),
    Mutation(
        "close-thread-failure-raised",
        "close() with no thread to close with closes the storage in the caller's thread",
        "lmcache_ec/engine.py",
        (
            "        except RuntimeError:  # no thread now (a pids limit): closed here, unbounded"
            "\n            self._close_storage(deadline)\n        else:\n"
        ),
        "        except RuntimeError:\n            raise\n        else:\n",
        (
            (
                "tests/faults/test_thread_limits.py::test_close_without_a_thread_to_close_with_cl"
                "oses_all_the_same"
            ),
        ),
    ),
    Mutation(
        "failed-start-leaves-the-event-loop",
        "a cache whose start fails after LMCache's event loop started leaves a process that exits",
        "lmcache_ec/storage/manager.py",
        (
            "            created = self._create_backends()\n            _stop_loops_at_exit(self)\n"
            "        except BaseException:\n            _unclosed.discard(self)\n            self._"
            "stop_loop()\n            raise\n        return created\n"
        ),
        (
            "            created = self._create_backends()\n        except BaseException:\n        "
            "    self._stop_loop()\n            raise\n        _stop_loops_at_exit(self)\n"
            "        return created\n"
        ),
        (
            (
                "tests/faults/test_thread_limits.py::test_a_cache_that_cannot_start_its_threads_l"
                "eaves_a_process_that_exits"
            ),
        ),
    ),
    Mutation(
        "numba-cache-left-unwritable",
        (
            "where numba's user cache cannot be made, NUMBA_CACHE_DIR points at the process dir ("
            "LMCache's import needs it)"
        ),
        "lmcache_ec/runtime_dirs.py",
        '        os.environ["NUMBA_CACHE_DIR"] = os.path.join(process_dir(), "numba")\n',
        "        pass\n",
        (
            (
                "tests/test_runtime_dirs.py::test_numba_caches_in_the_process_dir_where_its_user_"
                "cache_cannot_be_made"
            ),
        ),
    ),
    Mutation(
        "disk-log-with-a-record-ahead-not-read-again",
        (
            "a disk purge log whose record is ahead of this clock is read again until the record "
            "is taken"
        ),
        "lmcache_ec/purge/marker.py",
        "        if ahead:  # read again at each check until this clock reaches the record\n",
        "        if False:\n",
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_record_ahead_in_a_disk_log_is_taken_o"
                "nce_the_clock_reaches_it"
            ),
        ),
    ),
    Mutation(
        "record-ahead-counted-at-each-read",
        "a record waiting for this clock is counted as a bad record once, however often it is read",
        "lmcache_ec/purge/marker.py",
        (
            '                if self._report(f"a record of the {tier} purge log waits: {exc}", li'
            "ne):\n"
        ),
        (
            '                self._report(f"a record of the {tier} purge log waits: {exc}", line)'
            "\n                if True:\n"
        ),
        (
            (
                "tests/purge/test_purge_outcomes.py::test_a_record_ahead_in_a_disk_log_is_taken_o"
                "nce_the_clock_reaches_it"
            ),
        ),
    ),
    Mutation(
        "close-forgets-unsent-writes-silently",
        "a cache closed before its remote store returned says how many writes it never re-sent",
        "lmcache_ec/remote/backend.py",
        "        if unsent:  # remembered in memory only: a restart does not re-send them\n",
        "        if False:\n",
        (
            (
                "tests/faults/test_remote_recovery.py::test_a_close_before_the_store_returns_says"
                "_how_many_were_never_re_sent"
            ),
        ),
    ),
    Mutation(
        "claims-off-where-the-disk-parent-is-not-writable",
        (
            "a disk directory whose parent cannot be written keeps its claims inside it, shared b"
            "y every instance"
        ),
        "lmcache_ec/claims.py",
        (
            '        except OSError as exc:\n            logger.info("Claims beside %s cannot be m'
            'ade (%s): kept inside it", disk_dir, exc)\n'
        ),
        "        except OSError:\n            raise\n",
        (
            (
                "tests/test_claim_files.py::test_claims_go_inside_the_disk_directory_where_its_pa"
                "rent_cannot_be_written"
            ),
        ),
    ),
    Mutation(
        "start-trim-evicts-fresh-entries",
        (
            "a start with a smaller disk limit spares entries another process used within min_res"
            "idency_s"
        ),
        "lmcache_ec/tiers/budget.py",
        "            for entry in self._victims(scan):\n                if used <= self.limit:\n",
        "            for entry in scan.entries:\n                if used <= self.limit:\n",
        (
            (
                "tests/tiers/test_disk_budget.py::test_a_start_with_a_smaller_limit_spares_anothe"
                "r_process_fresh_entries"
            ),
        ),
    ),
    Mutation(
        "forked-child-waits-on-the-parents-cache",
        (
            "a forked child using its parent's ECCache gets a clear error at once, never a wait f"
            "or the parent's threads"
        ),
        "lmcache_ec/engine.py",
        "os.register_at_fork(after_in_child=_closed_in_a_forked_child)\n",
        "\n",
        (
            (
                "tests/test_get_or_compute.py::test_a_forked_child_gets_a_clear_error_from_the_pa"
                "rents_cache_not_a_wait"
            ),
        ),
    ),
    Mutation(
        "interrupted-batch-leaves-its-flights",
        (
            "a get_or_compute_many interrupted while joining lands the flights it leads (later ca"
            "lls never wait on them)"
        ),
        "lmcache_ec/storage/get_or_compute.py",
        (
            "            except BaseException:  # a caught Ctrl-C too: no flight of ours left unl"
            "anded\n                self._abandon(leading)\n                raise\n"
        ),
        (
            "            except RuntimeError:\n                self._abandon(leading)\n            "
            "    raise\n"
        ),
        (
            (
                "tests/test_get_or_compute.py::test_a_batch_interrupted_while_joining_leaves_no_f"
                "light_behind"
            ),
        ),
    ),
    Mutation(
        "claim-answers-dropped-before-collected",
        (
            "a batch of more keys than the claim answers kept waits on every key another instance"
            " holds"
        ),
        "lmcache_ec/claims.py",
        "                if now - when < self._ANSWER_KEPT_S:\n                    break\n",
        "",
        (
            (
                "tests/test_get_or_compute.py::test_a_batch_of_more_keys_than_answers_kept_waits_"
                "on_every_one_held_elsewhere"
            ),
        ),
    ),
    Mutation(
        "close-leaves-claims-of-computes-in-flight",
        "close() during a compute withdraws its claim (others do not wait out its TTL)",
        "lmcache_ec/claims.py",
        "        for name in list(self._held):\n            self._release(store, name)\n",
        "",
        ("tests/test_get_or_compute.py::test_close_during_a_compute_withdraws_its_claim",),
    ),
    Mutation(
        "unstored-batch-logged-per-entry",
        "a batch left unstored by a close is one log line, not one per entry",
        "lmcache_ec/storage/get_or_compute.py",
        '                unstored.append(f"{mm_hash:.40}: {exc}")\n',
        (
            '                unstored.append(f"{mm_hash:.40}: {exc}")\n                logger.warn'
            'ing("get_or_compute: %.40s not stored: %s", mm_hash, exc)\n'
        ),
        (
            (
                "tests/test_get_or_compute.py::test_a_batch_left_unstored_by_a_close_says_so_in_o"
                "ne_line"
            ),
        ),
    ),
    Mutation(
        "result-stored-after-a-removal",
        "a result computed across a remove() or a purge is returned but not stored",
        "lmcache_ec/storage/get_or_compute.py",
        "        purged = stamp == -1 or self._purge_stamp() != stamp\n",
        "        purged = False\n",
        (
            (
                "tests/test_get_or_compute.py::test_a_removal_while_an_entry_is_computed_keeps_it"
                "s_result_out_of_the_tiers"
            ),
        ),
    ),
    Mutation(
        "group-sharing-on-a-private-directory-silent",
        "local_disk_group_shared on a directory made private before says what its owner must run",
        "lmcache_ec/tiers/frame_directory.py",
        "        if modes.group_shared and mode & 0o2070 != 0o2070:  # made private before\n",
        "        if False:\n",
        (
            (
                "tests/tiers/test_disk_tier.py::test_group_sharing_turned_on_for_a_private_direct"
                "ory_says_what_it_needs"
            ),
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
