"""The CUDA paths of lmcache-ec, run once on a machine with an NVIDIA GPU.

Not part of the test suite (CI has no GPU). Checks, each bit for bit:

1. ``put`` from CUDA tensors, ``get``/``get_many`` to ``device="cuda"`` from the
   page-locked CPU pool and from the disk tier, ``get(pin_memory=True)``;
2. the worker side of the vLLM connector (``TierWorker``): a save from a CUDA
   encoder cache, staging into page-locked memory, and the batched load into
   ``encoder_cache`` with non-blocking copies;
3. the encoder-weights fingerprint of CUDA-resident weights (through
   ``weights_fingerprint``, whatever algorithm is behind it): stable, sensitive to
   one value and to a swap, the weights untouched;
4. that none of LMCache's device ops is called (its compiled ``cuda_ops`` may not
   load for this torch), and prints load bandwidth host -> device next to a plain
   ``tensor.to("cuda", non_blocking=True)`` of the same bytes from pinned memory.

Exit status 0: every check held; 1: a mismatch (each is printed); 2: no GPU, or
a package missing (run gpu/fetch-wheels.sh where pip works, carry .whl/).
``--imports-only`` imports what the check needs and exits; ``--cpu-dry-run`` runs
the same steps on the CPU (no page-locked memory, no bandwidth meaning): both
for trying the script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

import torch

FAILURES: list[str] = []
DEVICE = "cuda"  # "cpu" for --cpu-dry-run
ITEM = (256, 2560)  # one encoder output: 1.31 MB in bf16
BATCH = 32  # items loaded in one step for the bandwidth figures
REPEATS = 15


def check(condition: bool, what: str) -> None:
    print(f"  {'ok  ' if condition else 'FAIL'} {what}", flush=True)
    if not condition:
        FAILURES.append(what)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def pinned_check(condition: bool, what: str) -> None:
    """Page-locked memory exists only with CUDA: not checked in a CPU dry run."""
    if DEVICE == "cuda":
        check(condition, what)


def bit_equal(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    if a is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    a_bytes = a.detach().contiguous().view(torch.uint8).cpu()
    return torch.equal(a_bytes, b.detach().contiguous().view(torch.uint8).cpu())


def vllm_metadata_bases() -> str:
    """The two vLLM classes the worker side's metadata derives from. Without vLLM
    they are stood in by their definitions in vLLM 0.32/0.33 (plain ABCs, no state):
    what runs is lmcache-ec's own worker code either way."""
    try:
        importlib.import_module("vllm.distributed.ec_transfer.ec_connector.base")
        return "vLLM's"
    except ImportError:
        pass
    from abc import ABC, abstractmethod

    class ECConnectorMetadata(ABC):  # noqa: B024
        pass

    class ECConnectorWorkerMetadata(ABC):
        @abstractmethod
        def aggregate(self, other: Any) -> Any: ...

    base = types.ModuleType("vllm.distributed.ec_transfer.ec_connector.base")
    base.ECConnectorMetadata = ECConnectorMetadata  # type: ignore[attr-defined]
    base.ECConnectorWorkerMetadata = ECConnectorWorkerMetadata  # type: ignore[attr-defined]
    names = ["vllm", "vllm.distributed", "vllm.distributed.ec_transfer"]
    names.append("vllm.distributed.ec_transfer.ec_connector")
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[base.__name__] = base
    return "stood in (vLLM is not installed)"


def count_device_ops() -> list[str]:
    """Every call into ``lmcache.device_ops`` from now on."""
    import lmcache

    calls: list[str] = []
    for name in dir(lmcache.device_ops):
        op = getattr(lmcache.device_ops, name, None)
        if name.startswith("_") or isinstance(op, type) or not callable(op):
            continue

        def counted(*args: Any, _name: str = name, _op: Any = op, **kwargs: Any) -> Any:
            calls.append(_name)
            return _op(*args, **kwargs)

        setattr(lmcache.device_ops, name, counted)
    return calls


def lmcache_native() -> str:
    try:
        importlib.import_module("lmcache.cuda_ops")
        return "loaded"
    except ImportError as exc:
        return f"NOT loaded ({str(exc).rsplit(': ', 1)[-1]}): LMCache uses its torch fallbacks"


def timed(run: Callable[[], Any]) -> float:
    """Median seconds of ``run`` (which must synchronize), after a warm-up."""
    run()
    samples = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def items(count: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return {
        f"{seed:04d}{index:060d}": torch.randn(*ITEM, device=DEVICE, generator=generator).to(dtype)
        for index in range(count)
    }


def check_engine(directory: str) -> None:
    from lmcache_ec import ECCache

    config = {"max_local_cpu_size": 1.0, "local_disk": directory, "max_local_disk_size": 2.0}
    print("ECCache: put from CUDA, get to CUDA", flush=True)
    with ECCache.from_config(config, model="gpu-check/engine") as cache:
        pool = getattr(getattr(cache, "_cpu", None), "memory_allocator", None)
        pinned = pool is not None and pool.buffer.is_pinned()
        pinned_check(pinned, "the CPU pool is page-locked")
        for seed, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32), 10):
            for mm_hash, tensor in items(3, seed, dtype).items():
                check(cache.put(mm_hash, tensor), f"put {dtype} {tuple(tensor.shape)} from cuda")
                back = cache.get(mm_hash, device=DEVICE)
                sync()
                check(back is not None and back.device.type == DEVICE, f"get on {DEVICE}")
                check(bit_equal(back, tensor), f"get(device={DEVICE!r}) {dtype} bit-exact")
                host = cache.get(mm_hash, pin_memory=DEVICE == "cuda")
                pinned_check(host is not None and host.is_pinned(), "get(pin_memory) pinned")
                check(bit_equal(host, tensor), f"get to the host {dtype} bit-exact")
        batch = items(BATCH, 1)
        for mm_hash, tensor in batch.items():
            cache.put(mm_hash, tensor)
        got = cache.get_many(list(batch), device=DEVICE)
        sync()
        check(all(map(bit_equal, got, batch.values())), f"get_many of {BATCH} bit-exact")
        check(cache.flush(60), "writes reached the disk tier")
    with ECCache.from_config(config, model="gpu-check/engine") as cache:  # a fresh process
        got = cache.get_many(list(batch), device=DEVICE)
        sync()
        check(all(map(bit_equal, got, batch.values())), "get_many from the disk tier bit-exact")


def check_worker(directory: str) -> dict[str, float]:
    from lmcache_ec import ECCache
    from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
    from lmcache_ec.integration.vllm.metadata import ECTierConnectorMetadata
    from lmcache_ec.integration.vllm.worker import TierWorker

    config = {"max_local_cpu_size": 1.0, "local_disk": directory, "max_local_disk_size": 2.0}
    cache = ECCache.from_config(config, model="gpu-check/worker")
    worker = TierWorker(
        cache,
        ConnectorSettings(),
        persistable=lambda _: True,
        is_producer=True,
        is_consumer=True,
        device=DEVICE,
    )
    print("TierWorker: save from a CUDA encoder cache, stage, batched load", flush=True)
    try:
        outputs = items(BATCH, 2)
        produced = dict(outputs)  # vLLM's encoder cache on the producer
        for mm_hash in outputs:
            worker.save_caches(produced, mm_hash)
        check(worker.flush(60), "saves from the CUDA encoder cache landed")

        def stage() -> None:
            worker.stage(list(outputs), None, None)
            deadline = time.monotonic() + 30
            while len(worker._staged) < len(outputs) and time.monotonic() < deadline:
                time.sleep(0.001)

        def load() -> dict[str, torch.Tensor]:
            encoder_cache: dict[str, torch.Tensor] = {}
            meta = ECTierConnectorMetadata(loads={mm_hash: ITEM[0] for mm_hash in outputs})
            worker.start_load_caches(encoder_cache, meta)
            sync()
            return encoder_cache

        stage()
        staged = list(worker._staged.values())
        check(len(staged) == BATCH, f"{BATCH} outputs staged")
        pinned_check(all(t.is_pinned() for t in staged), "staged outputs are page-locked")
        encoder_cache = load()
        check(
            all(bit_equal(encoder_cache.get(k), v) for k, v in outputs.items()),
            f"batched load of {BATCH} into encoder_cache bit-exact",
        )
        on_device = all(t.device.type == DEVICE for t in encoder_cache.values())
        check(on_device, f"loaded outputs are on {DEVICE}")

        loads = []
        for _ in range(REPEATS):
            stage()
            started = time.perf_counter()
            load()
            loads.append(time.perf_counter() - started)
        pin = DEVICE == "cuda"
        pinned = [t.cpu().pin_memory() if pin else t.cpu() for t in outputs.values()]
        one = torch.cat([t.view(-1) for t in pinned])
        one = one.pin_memory() if pin else one

        def plain() -> None:
            for tensor in pinned:
                tensor.to(DEVICE, non_blocking=True, copy=True)
            sync()

        def plain_one() -> None:
            one.to(DEVICE, non_blocking=True, copy=True)
            sync()

        def engine_get() -> None:
            cache.get_many(list(outputs), device=DEVICE)
            sync()

        return {
            "worker batched load (staged, pinned)": statistics.median(loads),
            "ECCache.get_many(device='cuda') from the CPU tier": timed(engine_get),
            "plain .to('cuda', non_blocking=True) per item, pinned": timed(plain),
            "plain .to('cuda', non_blocking=True) one buffer, pinned": timed(plain_one),
        }
    finally:
        worker.close()


def check_fingerprint() -> float:
    from lmcache_ec.integration.vllm.weights import weights_fingerprint

    print("weights_fingerprint of CUDA-resident weights", flush=True)

    class Model(torch.nn.Module):
        def __init__(self, layers: int, width: int) -> None:
            super().__init__()
            made = {"device": DEVICE, "dtype": torch.bfloat16}
            self.vision_tower = torch.nn.Sequential(
                *(torch.nn.Linear(width, width, **made) for _ in range(layers))
            )
            self.language_model = torch.nn.Linear(64, 64, **made)

        def get_language_model(self) -> torch.nn.Module:
            return self.language_model

    torch.manual_seed(0)
    width = 4096 if DEVICE == "cuda" else 512
    model = Model(24, width)  # on a GPU ~400 M parameters, as a large vision tower
    weight = model.vision_tower[3].weight
    before = weight.detach().clone()
    first = weights_fingerprint(model)
    check(weights_fingerprint(model) == first, "the same weights give the same fingerprint")
    check(torch.equal(weight, before), "fingerprinting leaves the weights untouched")
    copy = Model(24, width)
    copy.load_state_dict(model.state_dict())
    check(weights_fingerprint(copy) == first, "another load of the same weights: same fingerprint")
    del copy
    with torch.no_grad():
        weight[3, 5] += 1
    check(weights_fingerprint(model) != first, "one changed value changes the fingerprint")
    with torch.no_grad():
        weight.copy_(before)
        flat = weight.view(-1)
        flat[[0, 1]] = flat[[1, 0]]
    check(weights_fingerprint(model) != first, "two swapped values change the fingerprint")
    with torch.no_grad():
        weight.copy_(before)
        model.language_model.weight.add_(1)
    check(weights_fingerprint(model) == first, "the language model is not in the fingerprint")
    sync()
    seconds = timed(lambda: (weights_fingerprint(model), sync()))
    parameters = sum(p.numel() for p in model.vision_tower.parameters())
    print(
        f"  fingerprint of {parameters / 1e6:.0f} M bf16 parameters on {DEVICE}: "
        f"{seconds * 1000:.1f} ms (median of {REPEATS})"
    )
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imports-only", action="store_true")
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.cpu_dry_run else "cuda"
    if not (args.imports_only or args.cpu_dry_run) and not torch.cuda.is_available():
        print(
            "gpu/check: no CUDA device: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA {torch.version.cuda}). "
            "Run this on a machine with an NVIDIA GPU and its driver.",
            file=sys.stderr,
        )
        return 2
    try:
        import lmcache

        import lmcache_ec
        import lmcache_ec.engine  # before any stand-in of vLLM's

        bases = vllm_metadata_bases()
        from lmcache_ec.integration.vllm import weights, worker  # noqa: F401
    except ImportError as exc:
        print(
            f"gpu/check: {exc}: install the wheels gpu/fetch-wheels.sh downloads into .whl/ "
            "(gpu/check.sh does) and run from the repository root",
            file=sys.stderr,
        )
        return 2

    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"lmcache {importlib.metadata.version('lmcache')}, lmcache-ec from "
        f"{lmcache_ec.__file__.rsplit('/lmcache_ec/', 1)[0]}"
    )
    print(f"LMCache cuda_ops: {lmcache_native()}; device ops {type(lmcache.device_ops).__name__}")
    print(f"vLLM metadata base classes: {bases}")
    if args.imports_only:
        return 0
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "none (CPU dry run)"
    print(f"GPU: {where}", flush=True)
    calls = count_device_ops()
    with tempfile.TemporaryDirectory(prefix="ec-gpu-check-") as directory:
        check_engine(f"{directory}/engine")
        figures = check_worker(f"{directory}/worker")
    check_fingerprint()
    check(calls == [], f"no LMCache device op was called ({sorted(set(calls)) or 'none'})")
    nbytes = BATCH * ITEM[0] * ITEM[1] * 2
    print(
        f"\nHost -> {DEVICE}, {BATCH} items of {ITEM} bf16 ({nbytes / 1e6:.1f} MB), "
        f"median of {REPEATS}:"
    )
    baseline = figures["plain .to('cuda', non_blocking=True) per item, pinned"]
    for name, seconds in figures.items():
        print(
            f"  {name:58s} {nbytes / seconds / 1e9:6.1f} GB/s  "
            f"{seconds * 1000:7.2f} ms  {baseline / seconds:5.2f}x plain"
        )
    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) FAILED:", *FAILURES, sep="\n  ", file=sys.stderr)
        return 1
    print("\nAll GPU checks passed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
