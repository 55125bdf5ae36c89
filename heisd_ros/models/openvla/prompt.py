r"""OpenVLA's prompt and tokenizer, loaded from the checkpoint directory only.

Prompt (OpenVLA's ``get_vla_action`` for OpenVLA-7B and its fine-tunes)::

    In: What action should the robot take to {instruction, lower case}?\nOut:

tokenised with the checkpoint's Llama-2 tokenizer (BOS first), followed by token 29871
("▁", the empty piece after the colon that training sequences had; ``predict_action``
appends it when missing). The prefix is then ``[BOS, 256 image patches, prompt tokens]``.

transformers 5 rebuilds a ``LlamaTokenizer`` from the vocabulary instead of running the
``tokenizer.json`` pipeline that OpenVLA's (4.40.1, fast) tokenizer ran; loading therefore
checks that both give the same ids on a probe prompt and refuses the tokenizer otherwise.
"""

from __future__ import annotations

from pathlib import Path

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
#: The "▁" piece appended after "Out:" (OpenVLA's ``predict_action``).
EMPTY_TOKEN_ID = 29871
EMPTY_PIECE = "\u2581"
_PROBE = "pick up the black bowl next to the plate and place it on the tray"


class OpenVLAPrompt:
    """Instruction -> prompt token ids (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, directory: Path, vocab_base: int, llama_config=None) -> OpenVLAPrompt:
        """Load and check the tokenizer of a checkpoint directory (no hub access).

        ``llama_config`` (the language model's ``LlamaConfig``) spares AutoTokenizer from
        reading config.json, whose ``auto_map`` points at OpenVLA's remote code.
        """
        from transformers import AutoTokenizer

        directory = Path(directory)
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False,
                config=llama_config)
        except (OSError, ValueError) as err:
            raise ValueError(f"{directory}: cannot load the tokenizer (tokenizer.json / "
                             f"tokenizer.model, tokenizer_config.json expected): {err}") from err
        if tokenizer.vocab_size != vocab_base:
            raise ValueError(f"{directory}: vocabulary size mismatch: the tokenizer has "
                             f"{tokenizer.vocab_size} tokens, config.json's text_config.vocab_size"
                             f" minus pad_to_multiple_of gives {vocab_base}")
        if tokenizer.bos_token_id is None:
            raise ValueError(f"{directory}: the tokenizer has no BOS token")
        piece = tokenizer.convert_ids_to_tokens(EMPTY_TOKEN_ID)
        if piece != EMPTY_PIECE:
            raise ValueError(f"{directory}: token {EMPTY_TOKEN_ID} is {piece!r}, OpenVLA's prompt "
                             f"needs {EMPTY_PIECE!r} there (not a Llama-2 tokenizer?)")
        prompt = cls(tokenizer)
        prompt.check_against_tokenizer_json(directory)
        return prompt

    def check_against_tokenizer_json(self, directory: Path) -> None:
        """Raise if ``tokenizer.json`` (what OpenVLA ran) tokenises the probe differently."""
        from tokenizers import Tokenizer

        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            return
        text = self.text(_PROBE)
        reference = Tokenizer.from_file(str(path)).encode(text).ids
        ours = self.tokenizer(text).input_ids
        if reference[:1] != ours[:1]:        # a post-processor that adds no BOS
            reference = [self.tokenizer.bos_token_id] + reference
        if list(reference) != list(ours):
            raise ValueError(f"{path}: transformers' tokenizer gives {ours} for {text!r} but "
                             f"tokenizer.json gives {reference}")

    @staticmethod
    def text(instruction: str) -> str:
        """The prompt text (surrounding whitespace of the instruction is dropped)."""
        if not instruction.strip():
            raise ValueError("instruction: expected a non-empty string")
        return PROMPT_TEMPLATE.format(instruction=instruction.strip().lower())

    def ids(self, instruction: str) -> list[int]:
        """[BOS, prompt tokens..., 29871]."""
        ids = list(self.tokenizer(self.text(instruction)).input_ids)
        if not ids or ids[0] != self.tokenizer.bos_token_id:
            ids = [self.tokenizer.bos_token_id] + ids
        if ids[-1] != EMPTY_TOKEN_ID:
            ids.append(EMPTY_TOKEN_ID)
        return ids
