"""The tokenizer of a checkpoint, with the chat template, and incremental (streaming) detokenisation.

``ChatTokenizer`` wraps a ``tokenizers.Tokenizer`` loaded from a checkpoint directory
(``tokenizer.json`` + ``tokenizer_config.json``, and ``chat_template.jinja`` when transformers 5 saved
the template there). It renders chats with the checkpoint's template (``render_chat``: transformers'
semantics) and encodes them. By default the control tokens that occur *inside* message contents and
tool schemas (say a file that contains ``<|END_OF_TURN_TOKEN|>``) are encoded as plain text, so content
cannot forge turn structure; the template's own control tokens stay single ids.

``IncrementalDetokenizer`` turns a stream of token ids into text without ever splitting a UTF-8
character, in O(1) amortised work per token: every id maps to its bytes (a table built once per
tokenizer) and a UTF-8 incremental decoder holds back an incomplete trailing sequence. Invalid bytes
become U+FFFD exactly as ``bytes.decode("utf-8", "replace")`` does (one U+FFFD per maximal invalid
subpart), which is what the ``tokenizers`` byte-level decoder does too, so the concatenated stream
always equals ``decode(all_ids)``.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.template import chat_template as default_chat_template
from mkcode.backend.chat.template import render_chat

__all__ = ["ChatTokenizer", "IncrementalDetokenizer", "byte_level_table"]

# Private-use characters that bracket control tokens found in user-supplied strings while rendering.
_MARK_START = "\ue000"
_MARK_END = "\ue001"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte maps to one printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in _bytes_to_unicode().items()}


def _uses_byte_level_decoder(decoder: Mapping[str, Any] | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    if decoder.get("type") == "Sequence":
        return any(_uses_byte_level_decoder(d) for d in decoder.get("decoders", []))
    return False


def byte_level_table(tok: Tokenizer) -> tuple[list[bytes], list[bool]]:
    """For each id: the bytes it decodes to, and whether it is a special (skippable) added token.

    Requires a byte-level decoder (Cohere's and the synthetic tokenizers use one); raises ``ValueError``
    otherwise, because per-token bytes are not well defined for other decoders.
    """
    spec = json.loads(tok.to_str())
    if not _uses_byte_level_decoder(spec.get("decoder")):
        raise ValueError("incremental detokenisation needs a byte-level BPE tokenizer (ByteLevel decoder)")
    size = tok.get_vocab_size(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    pieces: list[bytes] = [b""] * size
    special: list[bool] = [False] * size
    for i in range(size):
        if i in added:
            pieces[i] = added[i].content.encode("utf-8")
            special[i] = bool(added[i].special)
            continue
        token = tok.id_to_token(i)
        if token is None:
            continue
        pieces[i] = bytes(_UNICODE_TO_BYTE[c] if c in _UNICODE_TO_BYTE else ord(c) & 0xFF for c in token)
    return pieces, special


def _config_token(value: Any) -> str | None:
    """A token named in tokenizer_config.json: a string, or an AddedToken-shaped dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class ChatTokenizer:
    """A checkpoint's tokenizer plus its chat template.

    ``ChatTokenizer(path)`` loads a checkpoint directory; ``ChatTokenizer.from_tokenizer`` wraps an
    in-memory tokenizer. Without a chat template in the checkpoint, mkcode's cmd4 template is used.
    """

    def __init__(self, path: str | Path) -> None:
        root = Path(path)
        config_path = root / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        template_path = root / "chat_template.jinja"
        template: str | None
        if template_path.exists():
            template = template_path.read_text(encoding="utf-8")
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # older form: [{"name": ..., "template": ...}]
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
                template = named.get("default") or next(iter(named.values()), None)
        self._init(Tokenizer.from_file(str(root / "tokenizer.json")), config, template)

    @classmethod
    def from_tokenizer(
        cls, tok: Tokenizer, chat_template: str | None = None, config: Mapping[str, Any] | None = None
    ) -> ChatTokenizer:
        """Wrap an in-memory ``tokenizers.Tokenizer`` (``config`` as in ``tokenizer_config.json``)."""
        self = cls.__new__(cls)
        self._init(tok, dict(config or {}), chat_template)
        return self

    def _init(self, tok: Tokenizer, config: dict[str, Any], template: str | None) -> None:
        self._tok = tok
        self._config = config
        self.chat_template: str = (
            template if isinstance(template, str) and template else default_chat_template()
        )
        self.bos_token: str = _config_token(config.get("bos_token")) or st.BOS_TOKEN
        self.eos_token: str = _config_token(config.get("eos_token")) or st.EOS_TOKEN
        self._added = {t.content for t in tok.get_added_tokens_decoder().values()}
        pattern = "|".join(re.escape(t) for t in sorted(self._added, key=len, reverse=True))
        self._control_re = re.compile(pattern or "(?!)")
        self._marked_re = re.compile(
            f"{_MARK_START}({pattern or '(?!)'}){_MARK_END}|[{_MARK_START}{_MARK_END}]"
        )

    # -- vocabulary -----------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` (a vocabulary entry or added token), or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id``, or None."""
        return self._tok.id_to_token(token_id)

    @property
    def bos_token_id(self) -> int | None:
        """Id of the BOS token (``<BOS_TOKEN>``), None if the vocabulary lacks it."""
        return self._tok.token_to_id(self.bos_token)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: ``<|END_OF_TURN_TOKEN|>`` and the config's eos, sorted."""
        ids = {self._tok.token_to_id(t) for t in (st.END_OF_TURN, self.eos_token)}
        return tuple(sorted(i for i in ids if i is not None))

    @property
    def pad_token_id(self) -> int | None:
        """Id of the pad token (config ``pad_token``, else ``<PAD>``)."""
        return self._tok.token_to_id(_config_token(self._config.get("pad_token")) or st.PAD_TOKEN)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special added token (dropped by ``skip_special_tokens``)."""
        specials = self._byte_table[1]
        return 0 <= token_id < len(specials) and specials[token_id]

    # -- text <-> ids ---------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Encode ``text``; special-token strings in it become their single ids."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_plain(self, text: str) -> list[int]:
        """Encode ``text`` with no added-token matching: control-token strings become ordinary pieces."""
        if self._tok.normalizer is not None:
            text = self._tok.normalizer.normalize_str(text)
        pieces = (
            [text]
            if self._tok.pre_tokenizer is None
            else [p for p, _ in self._tok.pre_tokenizer.pre_tokenize_str(text)]
        )
        return [t.id for piece in pieces for t in self._tok.model.tokenize(piece)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Decode ``ids`` to text (invalid UTF-8 becomes U+FFFD)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def _byte_table(self) -> tuple[list[bytes], list[bool]]:
        return byte_level_table(self._tok)

    def detokenizer(self, skip_special_tokens: bool = False) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer (one per request)."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # -- chats ----------------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kw: Any,
    ) -> str:
        """Render the chat to the prompt string (transformers' ``apply_chat_template(tokenize=False)``)."""
        kw.setdefault("bos_token", self.bos_token)
        kw.setdefault("eos_token", self.eos_token)
        return render_chat(self.chat_template, messages, tools, add_generation_prompt, **kw)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        *,
        sanitize: bool = True,
        **kw: Any,
    ) -> list[int]:
        """Render and encode the chat. ``decode(result) == render(...)`` always.

        With ``sanitize`` (default), control-token strings inside message contents, tool-call arguments
        and tool schemas are encoded as plain text rather than as control ids.
        """
        if not sanitize:
            return self.encode(self.render(messages, tools, add_generation_prompt, **kw))
        marked_messages = self._mark(list(messages))
        marked_tools = self._mark(list(tools)) if tools is not None else None
        text = self.render(marked_messages, marked_tools, add_generation_prompt, **kw)
        ids: list[int] = []
        pos = 0
        for m in self._marked_re.finditer(text):
            ids += self.encode(text[pos : m.start()])
            if m.group(1) is not None:
                ids += self.encode_plain(m.group(1))
            pos = m.end()
        ids += self.encode(text[pos:])
        return ids

    def _mark(self, obj: Any) -> Any:
        """Bracket control tokens in every string (keys too) with private-use markers; drop stray markers."""
        if isinstance(obj, str):
            obj = obj.replace(_MARK_START, "").replace(_MARK_END, "")
            return self._control_re.sub(lambda m: _MARK_START + m.group(0) + _MARK_END, obj)
        if isinstance(obj, Mapping):
            return {self._mark(k): self._mark(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self._mark(v) for v in obj]
        return obj


class IncrementalDetokenizer:
    """Streaming detokenisation for one request: ``push`` ids, get the newly completed text.

    ``"".join(push(i) for i in ids) + flush() == tokenizer.decode(ids, skip_special_tokens)`` for any id
    sequence. Text is only returned once its UTF-8 bytes are complete; a trailing incomplete sequence is
    held back (at most 3 bytes) until the next id completes it, proves it invalid (then U+FFFD, as
    ``bytes.decode(errors="replace")`` writes it) or ``flush`` ends the stream. Ids outside the
    vocabulary decode to nothing, as in ``tokenizers``.
    """

    def __init__(self, tokenizer: ChatTokenizer, skip_special_tokens: bool = False) -> None:
        self._pieces, self._special = tokenizer._byte_table
        self._skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (possibly empty)."""
        if not 0 <= token_id < len(self._pieces) or (self._skip_special and self._special[token_id]):
            return ""
        return self._decoder.decode(self._pieces[token_id])

    def push_many(self, token_ids: Sequence[int]) -> str:
        """Add several ids; return the text they complete."""
        return "".join(self.push(i) for i in token_ids)

    def flush(self) -> str:
        """End the stream: return held-back bytes (incomplete ones as U+FFFD) and reset."""
        out = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out
