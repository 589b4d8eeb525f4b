"""The serving engine: requests, scheduling, continuous batching, decode backends."""
