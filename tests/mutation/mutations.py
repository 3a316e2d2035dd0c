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
]


# -- an entry never costs more than it declares (codec.check_stored_size)
T_PADDING = "tests/faults/test_padding.py"
MUTATIONS += [
    Mutation(
        "disk-read-sized-by-the-file",
        "a disk read allocates the frame's declared size, never the file's",
        "lmcache_ec/tiers/disk_layout.py",
        "frame = np.empty(check_stored_size(prefix, size), dtype=np.uint8)",
        "frame = np.empty(size, dtype=np.uint8)",
        (f"{T_PADDING}::test_padded_disk_entry_is_a_counted_miss_and_its_tail_is_never_read",),
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
            "tests/remote/test_remote_reads.py::test_get_many_of_more_than_one_batch_hits_every_entry",
        ),
    ),
    Mutation(
        "redis-cluster-replies-out-of-order",
        "a cluster's per-shard replies reach their own keys",
        "lmcache_ec/remote/redis_store.py",
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
T_BUDGET = "tests/test_disk_budget.py"
T_LAYOUT = "tests/test_disk_layout.py"
MUTATIONS += [
    Mutation(
        "ledger-keeps-removed-bytes",
        "a removal by the tier gives its bytes back to the ledger",
        "lmcache_ec/tiers/budget.py",
        "        self._own.discard(name)\n        self._subtract(size)\n",
        "        self._own.discard(name)\n",
        (f"{T_BUDGET}::test_the_ledger_equals_the_bytes_on_disk_after_a_removal_and_a_lost_race",),
    ),
    Mutation(
        "lost-publish-keeps-its-reservation",
        "a write that loses the publish race gives its reservation back",
        "lmcache_ec/tiers/frame_directory.py",
        "            else:\n                self.budget.release(size)\n",
        "            else:\n                pass\n",
        (f"{T_BUDGET}::test_the_ledger_equals_the_bytes_on_disk_after_a_removal_and_a_lost_race",),
    ),
    Mutation(
        "scan-forgets-a-write-published-meanwhile",
        "a write published between a scan's listing and its stat counts at its reservation",
        "lmcache_ec/tiers/disk_layout.py",
        "                        writes[item.inode()] = temp_reserved(name)\n",
        "                        pass\n",
        (f"{T_LAYOUT}::test_a_write_published_between_listing_and_stat_counts_at_its_reservation",),
    ),
    # -- a late promotion never outranks newer entries in the CPU tier's LRU
    Mutation(
        "late-promotion-goes-to-the-front",
        "a promoted old entry takes its place in the CPU tier's use order as of its read",
        "lmcache_ec/reads.py",
        "self._write_above(key, memory_obj, above, since)",
        "self._write_above(key, memory_obj, above)",
        ("tests/test_reads.py::test_a_promotion_that_lands_after_newer_puts_ranks_behind_them",),
    ),
]

# -- purges: none lost, records untrusted, each scoped to its own namespace
T_PURGE = "tests/test_purge_log.py"
MARKER = "lmcache_ec/purge_marker.py"
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
        "        fcntl.flock(fd, fcntl.LOCK_EX)\n",
        "        pass\n",
        (f"{T_PURGE}::test_appends_made_at_once_are_all_kept_on_disk",),
    ),
    Mutation(
        "purge-log-read-whole",
        "a reader takes at most LOG_LIMIT + 1 bytes of a purge log",
        "lmcache_ec/remote/redis_store.py",
        "return bytes(self._client.getrange(name, -size, -1)) or None",
        "return bytes(self._client.getrange(name, 0, -1)) or None",
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
        'min(_seconds(record["time"], "time"), now)',
        '_seconds(record["time"], "time")',
        (f"{T_PURGE}::test_a_record_from_the_future_is_clamped_to_the_readers_clock",),
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
    Mutation(
        "purge-watch-stops-on-an-error",
        "the purge watch thread outlives any exception",
        "lmcache_ec/purge_follow.py",
        "                except Exception as exc:  # the watch outlives anything one check does\n"
        "                    self._failed(exc)\n",
        "                except Exception:\n                    return\n",
        (f"{T_PURGE}::test_the_watch_thread_survives_any_exception",),
    ),
    Mutation(
        "cpu-purge-ignores-weights",
        "a purge of one weights version keeps other versions' CPU entries",
        "lmcache_ec/purge_follow.py",
        "            if known and identity.weights != selector.weights:\n",
        "            if False:\n",
        (f"{T_PURGE}::test_a_purge_of_one_weights_version_keeps_the_others_cpu_entries",),
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
