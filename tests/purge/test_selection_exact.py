"""A purge or listing by namespace or model reaches that exact name, not another
whose slug is the same.

A storage name's slugs carry 32 bits of hash of the exact namespace and model
(``key.py``): two names that share their readable part and their tag select
each other's entries by name. ``lmcache-ec purge`` and ``ls``, and an engine
applying a purge record to its own directories, confirm each named entry's
exact namespace and model from its frame header, so the other name's entries
stay. An entry whose header proves nothing (damaged, or stating another
identity than its name was made from) is still taken by its name.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import torch
import yaml
from typer.testing import CliRunner

from lmcache_ec.cli import app
from lmcache_ec.key import slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import PurgeMarker, append_disk

# Pairs of names with equal slugs (found by a birthday search, ~1e5 tries each).
NAMESPACES = (
    "acme-production-cluster-eu-west-tenant-9666",
    "acme-production-cluster-eu-west-tenant-23282",
)
MODELS = (
    "org/vision-encoder-large-patch14-336-finetune-39111",
    "org/vision-encoder-large-patch14-336-finetune-67452",
)
TENSOR = torch.ones(4, 8, dtype=torch.bfloat16)


def test_the_names_here_share_their_slugs():
    assert NAMESPACES[0] != NAMESPACES[1] and slug(NAMESPACES[0]) == slug(NAMESPACES[1])
    assert MODELS[0] != MODELS[1] and slug(MODELS[0]) == slug(MODELS[1])


def _store(make_cache, count: int, **identity) -> list[str]:
    """The file names of ``count`` entries stored under ``identity`` (closed after)."""
    with make_cache(**identity) as writer:
        keys = [writer.key(f"image-{i}") for i in range(count)]
        assert all(writer.put(f"image-{i}", TENSOR) for i in range(count))
        assert writer.flush(30)
    return [f"{key.storage_name}.pt" for key in keys]


def _files(directory) -> set[str]:
    return {name for name in os.listdir(directory) if name.endswith(".pt")}


def _cli(tmp_path, local_config, *args: str) -> str:
    path = tmp_path / "lmcache.yaml"
    path.write_text(yaml.safe_dump({"chunk_size": 256, "ec": local_config}))
    result = CliRunner().invoke(app, [*args, "--config", str(path)])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_purging_a_namespace_leaves_another_whose_slug_is_the_same(
    tmp_path, disk_dir, local_config, make_cache
):
    purged = _store(make_cache, 3, model="m", namespace=NAMESPACES[0])
    kept = _store(make_cache, 2, model="m", namespace=NAMESPACES[1])
    dry = _cli(tmp_path, local_config, "purge", "--namespace", NAMESPACES[0], "--dry-run")
    assert "would delete 3 entries" in dry
    out = _cli(tmp_path, local_config, "purge", "--namespace", NAMESPACES[0])
    assert "deleted 3 entries" in out
    assert _files(disk_dir) == set(kept) and not set(purged) & _files(disk_dir)
    with make_cache(model="m", namespace=NAMESPACES[1]) as other:
        assert all(other.get(f"image-{i}") is not None for i in range(2))


def test_purging_and_listing_a_model_leave_another_whose_slug_is_the_same(
    tmp_path, disk_dir, local_config, make_cache
):
    purged = _store(make_cache, 2, model=MODELS[0])
    kept = _store(make_cache, 3, model=MODELS[1])
    listed = json.loads(_cli(tmp_path, local_config, "ls", "--model", MODELS[0], "--json"))
    assert {f"{row['name']}.pt" for row in listed} == set(purged)
    assert {row["model"] for row in listed} == {MODELS[0]}
    assert "deleted 2 entries" in _cli(tmp_path, local_config, "purge", "--model", MODELS[0])
    assert _files(disk_dir) == set(kept) and not set(purged) & _files(disk_dir)


def test_entries_whose_headers_prove_nothing_are_purged_by_their_names(
    tmp_path, disk_dir, local_config, make_cache
):
    damaged, forged = _store(make_cache, 2, model="m", namespace=NAMESPACES[0])
    (kept,) = _store(make_cache, 1, model="m", namespace=NAMESPACES[1])
    with open(disk_dir / damaged, "r+b") as stream:
        stream.write(b"garbage!")  # no header to read
    shutil.copyfile(disk_dir / kept, disk_dir / forged)  # a header of the other namespace
    out = _cli(tmp_path, local_config, "purge", "--namespace", NAMESPACES[0])
    assert "deleted 2 entries" in out
    assert _files(disk_dir) == {kept}


def test_an_engine_applying_a_purge_leaves_its_model_whose_slug_is_the_purged_one(
    disk_dir, make_cache
):
    engine = make_cache(model=MODELS[1], purge_check_s=0.05)
    kept = _store(make_cache, 3, model=MODELS[1])
    purged = _store(make_cache, 1, model=MODELS[0])
    # The purged entry newest: the engine deletes what it selects oldest
    # first, so once that one is gone, any of the others it took would be too.
    now = time.time()
    for age, name in enumerate(reversed(kept), start=1):
        os.utime(disk_dir / name, (now - age, now - age))
    marker = PurgeMarker.new(Selector(model=MODELS[0]))
    append_disk(str(disk_dir), slug("default"), marker.to_line())
    deadline = time.monotonic() + 20
    while set(purged) & _files(disk_dir):
        assert time.monotonic() < deadline, "the engine never applied the purge"
        time.sleep(0.02)
    assert _files(disk_dir) == set(kept)
    assert all(engine.get(f"image-{i}") is not None for i in range(3))
