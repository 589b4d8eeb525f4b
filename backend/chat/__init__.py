"""Tokenizer and chat format (Cohere cmd4) for North Mini Code: special tokens, the chat template, a
synthetic tokenizer for tests, the tokenizer wrapper with incremental detokenisation, and the streaming
parser of generations."""
