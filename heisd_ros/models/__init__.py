"""Models: the target-VLA interface, the shipped small VLA, adapters and the draft head.

- ``target``: :class:`TargetVLA` (encode, prefill/verify a token tree in one forward, commit
  the accepted path), :class:`Prefix`, :class:`DecodeState`, :class:`ForwardOutput`.
- ``draft_tree``: :class:`DraftTree`, the token-tree contract every draft source produces
  and the target verifies (numpy only).
- ``small_vla`` / ``small_vla_config`` / ``vision`` / ``vocab``: the shipped small VLA
  (two-camera encoder + ``LlamaForCausalLM``, byte tokenizer with 256 action ids).
- ``checkpoint``: safetensors save/load with checks (small VLA, draft head).
- ``draft_head``: the EAGLE-style head (trained by ``heisd_ros.training.draft_training``).
- ``synthetic_scenes``: seeded synthetic observations until recorded ones exist.

Submodules are imported explicitly; importing this package loads neither torch nor
transformers.
"""
