"""The small VLA's byte-level tokenizer: no files, no hub.

Vocabulary layout (ids):
    0 pad, 1 bos, 2 eos                              specials
    3 .. 258                                         the 256 byte values of UTF-8 text
    vocab_base - 256 .. vocab_base - 1               the 256 action bins (bin b = vocab_base-1-b)
    vocab_base .. model_vocab_size - 1               padding rows, never produced
With the defaults vocab_base = 515 (no gap between bytes and actions) and the embedding table
padded to 576 rows, like OpenVLA's 32000 tokenizer ids in a 32064-row table.
"""

from __future__ import annotations

from dataclasses import dataclass

from heisd_ros.actions.bins import N_BINS, ActionTokenMap

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3
BYTE_OFFSET = N_SPECIAL


@dataclass(frozen=True)
class ByteVocab:
    """Validated vocabulary layout of the byte tokenizer (see the module docstring)."""

    vocab_base: int = BYTE_OFFSET + 256 + N_BINS
    model_vocab_size: int = 576

    def __post_init__(self) -> None:
        lowest = BYTE_OFFSET + 256 + N_BINS
        if self.vocab_base < lowest:
            raise ValueError(f"vocab_base: action ids would overlap the byte ids; expected >= "
                             f"{lowest}, got {self.vocab_base}")
        if self.model_vocab_size < self.vocab_base:
            raise ValueError(f"model_vocab_size: expected >= vocab_base {self.vocab_base}, "
                             f"got {self.model_vocab_size}")

    @property
    def actions(self) -> ActionTokenMap:
        """Bin <-> id mapping of this layout."""
        return ActionTokenMap(vocab_base=self.vocab_base)

    def encode_text(self, text: str, max_bytes: int) -> list[int]:
        """Ids of the UTF-8 bytes of ``text``, cut to ``max_bytes`` bytes."""
        return [BYTE_OFFSET + b for b in text.encode("utf-8")[:max_bytes]]

    def decode_text(self, ids) -> str:
        """Text of the byte ids in ``ids`` (other ids are skipped)."""
        raw = bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256)
        return raw.decode("utf-8", errors="replace")
