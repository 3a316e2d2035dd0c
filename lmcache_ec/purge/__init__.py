"""Purging and listing entries across processes and tiers.

- ``selection``: what a purge or a listing selects; disk and remote seen from
  outside the serving process.
- ``marker``: the append-only purge log of a namespace (its rules, appends
  that never lose a record, bounded reads).
- ``follow``: purges made by other processes, applied to this engine.
- ``inventory``: listing and purging from outside the serving process (CLI).
"""
