"""Mutation check: plant each bug in ``mutations.py`` in a copy, run the tests that must catch it.

``python -m tests.mutation`` from the repository root, inside the virtualenv.
See ``docs/testing.md``.
"""
