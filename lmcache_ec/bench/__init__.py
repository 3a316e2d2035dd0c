"""Benchmarks that measure lmcache-ec next to a baseline in the same run.

``lmcache-ec bench`` (``run.py``) runs everything at once: every tier
(``local_tiers``, ``remote_tiers``), the vLLM connector's hot paths
(``connector_paths``) and start-up (``startup``), each job in a fresh worker
process (``worker``), against upstream ``ECCacheEngine``, vLLM's
``ECExampleConnector`` and the physical limit (``subjects``). ``targets``
adds ratios and pass/fail, ``report`` and ``chart`` render the result.

The focused subcommands ``local``, ``remote`` and ``connector`` run the same
jobs and show them as flat rows (``focused``); ``steps`` measures engine step
time with prefetch, ``fleet`` several engine processes sharing one store,
``serve`` real ``vllm serve`` processes.

lmcache-ec is measured through its public API; the baselines' private parts
are reached in ``private_access`` only. Test-only packages (moto) are imported when a
run needs them, with an error naming the extra that provides them.

Each module returns plain dicts (JSON-ready); the CLI renders them.
"""
