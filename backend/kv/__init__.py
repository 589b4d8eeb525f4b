"""Paged KV cache: the pool layout, page allocation, prefix cache and per-request block tables."""
