"""Cohere's special tokens: the single source of truth for the chat format.

Every string the cmd4 prompt format (``cohere_melody.render_cmd4``) emits as a control marker, plus the
markers the model writes in its generations, is listed here once. The chat template, the synthetic
tokenizer, the tokenizer wrapper and the generation parser all import these names instead of spelling the
strings themselves, so a typo cannot split one token into two.

The base tokens (``<PAD>`` … ``<EOS_TOKEN>``) come first, in Cohere's vocabulary order; the chat-turn
tokens follow. ``END_OF_TURN`` is the end-of-sequence token of a chat generation (id 255001 in the
released North Mini Code vocabulary).
"""

from __future__ import annotations

PAD = "<PAD>"
UNK = "<UNK>"
CLS = "<CLS>"
SEP = "<SEP>"
MASK = "<MASK_TOKEN>"
BOS = "<BOS_TOKEN>"
EOS = "<EOS_TOKEN>"

START_OF_TURN = "<|START_OF_TURN_TOKEN|>"
END_OF_TURN = "<|END_OF_TURN_TOKEN|>"
USER = "<|USER_TOKEN|>"
CHATBOT = "<|CHATBOT_TOKEN|>"
SYSTEM = "<|SYSTEM_TOKEN|>"
START_THINKING = "<|START_THINKING|>"
END_THINKING = "<|END_THINKING|>"
START_RESPONSE = "<|START_RESPONSE|>"
END_RESPONSE = "<|END_RESPONSE|>"
START_TEXT = "<|START_TEXT|>"
END_TEXT = "<|END_TEXT|>"
START_ACTION = "<|START_ACTION|>"
END_ACTION = "<|END_ACTION|>"
START_TOOL_RESULT = "<|START_TOOL_RESULT|>"
END_TOOL_RESULT = "<|END_TOOL_RESULT|>"

#: Tokens of the base vocabulary (ids 0..6 in Cohere's tokenizers).
BASE_TOKENS: tuple[str, ...] = (PAD, UNK, CLS, SEP, MASK, BOS, EOS)

#: Tokens that structure a chat: turns, roles, and the blocks inside a chatbot turn.
CHAT_TOKENS: tuple[str, ...] = (
    START_OF_TURN,
    END_OF_TURN,
    USER,
    CHATBOT,
    SYSTEM,
    START_THINKING,
    END_THINKING,
    START_RESPONSE,
    END_RESPONSE,
    START_TEXT,
    END_TEXT,
    START_ACTION,
    END_ACTION,
    START_TOOL_RESULT,
    END_TOOL_RESULT,
)

#: Every special token, base tokens first. Order is the id order in the synthetic tokenizer.
SPECIAL_TOKENS: tuple[str, ...] = BASE_TOKENS + CHAT_TOKENS

#: The token that ends a chat generation (the model's eos).
EOS_TOKEN = END_OF_TURN
#: The token every rendered prompt starts with.
BOS_TOKEN = BOS
#: Padding token for batched tensors.
PAD_TOKEN = PAD

__all__ = [
    "BASE_TOKENS",
    "BOS",
    "BOS_TOKEN",
    "CHATBOT",
    "CHAT_TOKENS",
    "CLS",
    "END_ACTION",
    "END_OF_TURN",
    "END_RESPONSE",
    "END_TEXT",
    "END_THINKING",
    "END_TOOL_RESULT",
    "EOS",
    "EOS_TOKEN",
    "MASK",
    "PAD",
    "PAD_TOKEN",
    "SEP",
    "SPECIAL_TOKENS",
    "START_ACTION",
    "START_OF_TURN",
    "START_RESPONSE",
    "START_TEXT",
    "START_THINKING",
    "START_TOOL_RESULT",
    "SYSTEM",
    "UNK",
    "USER",
]
