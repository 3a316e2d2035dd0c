"""Bridges from the encoder tier into serving engines (``vllm``)."""
