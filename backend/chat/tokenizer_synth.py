"""A small byte-level BPE tokenizer trained in-process, for synthetic checkpoints and tests.

The released North Mini Code tokenizer (262,144 tokens) cannot ship with tests, so tiny checkpoints get a
tokenizer of their own: byte-level BPE (every byte sequence is encodable, like Cohere's), trained with
the ``tokenizers`` library on Python source from the interpreter's standard library, which is present on
every machine. Files are picked by a seeded shuffle of the sorted file list, ~2 MB (more, up to 6 MB, for
vocabularies above ~12k), so training takes a few seconds. The result is deterministic for a given interpreter: the same ``(vocab_size, seed)``
gives a byte-identical ``tokenizer.json`` (a different Python version has a different stdlib, hence a
different tokenizer).

Layout of the vocabulary: Cohere's base tokens (``<PAD>`` … ``<EOS_TOKEN>``) are ids 0–6, then the 256
byte symbols and the learned merges, and the chat-turn tokens take the last ids, as in the release
vocabulary (where ``<|END_OF_TURN_TOKEN|>`` is 255001). All special tokens are added special tokens,
so each one is a single id wherever it appears in text. If the corpus cannot support the requested
size, the gap is filled with special ``<|RESERVED_TOKEN_i|>`` tokens before the chat tokens.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mkcode.backend.chat import special_tokens as st

__all__ = ["corpus_files", "save_tokenizer_files", "train_synthetic_tokenizer"]

#: Bytes of stdlib source to train on.
CORPUS_BYTES = 2_000_000
#: Corpus bytes per requested token beyond the default budget, and the corpus cap.
BYTES_PER_TOKEN = 160
MAX_CORPUS_BYTES = 6_000_000
#: Smallest vocabulary that holds the base tokens, 256 bytes and the chat tokens.
MIN_VOCAB = len(st.BASE_TOKENS) + 256 + len(st.CHAT_TOKENS)
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}


def corpus_files(seed: int = 0, max_bytes: int = CORPUS_BYTES) -> list[Path]:
    """The stdlib ``.py`` files to train on: sorted, shuffled by ``seed``, taken until ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files.extend(os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py"))
    files.sort()
    random.Random(seed).shuffle(files)
    chosen: list[Path] = []
    total = 0
    for rel in files:
        path = root / rel
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if size == 0 or size > max_bytes // 4:
            continue
        chosen.append(path)
        total += size
        if total >= max_bytes:
            break
    if not chosen:
        raise RuntimeError(f"no Python source found under {root} to train a tokenizer on")
    return chosen


def _texts(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        yield path.read_bytes().decode("utf-8", errors="replace")


def train_synthetic_tokenizer(vocab_size: int, seed: int = 0) -> Tokenizer:
    """Train a byte-level BPE of exactly ``vocab_size`` tokens, special tokens included.

    Deterministic for a given Python installation: same arguments, byte-identical ``to_str()``.
    """
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB}, got {vocab_size}")
    bpe_size = vocab_size - len(st.CHAT_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=2,
        special_tokens=list(st.BASE_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    budget = max(CORPUS_BYTES, min(BYTES_PER_TOKEN * vocab_size, MAX_CORPUS_BYTES))
    tok.train_from_iterator(_texts(corpus_files(seed, budget)), trainer=trainer)
    # A large vocab can outgrow what the corpus supports; fill the gap with reserved tokens.
    missing = bpe_size - tok.get_vocab_size()
    tok.add_special_tokens([f"<|RESERVED_TOKEN_{i}|>" for i in range(missing)])
    tok.add_special_tokens(list(st.CHAT_TOKENS))
    assert tok.get_vocab_size() == vocab_size
    return tok


def save_tokenizer_files(tok: Tokenizer, out_dir: str | os.PathLike[str], chat_template: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template) into ``out_dir``.

    The config loads with transformers' ``AutoTokenizer`` as a ``PreTrainedTokenizerFast`` that adds no
    BOS/EOS itself (the chat template writes ``<BOS_TOKEN>``), with ``<|END_OF_TURN_TOKEN|>`` as eos.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in st.SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": st.BOS_TOKEN,
        "eos_token": st.EOS_TOKEN,
        "pad_token": st.PAD_TOKEN,
        "unk_token": st.UNK,
        "cls_token": st.CLS,
        "sep_token": st.SEP,
        "mask_token": st.MASK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "added_tokens_decoder": added,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
