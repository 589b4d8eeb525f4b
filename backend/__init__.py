"""mkcode.backend: model, tokenizer and chat format, checkpoints, KV cache, engine, megakernel host
side, HTTP server and benchmarks. Imports neither mkcode.app nor Textual."""
