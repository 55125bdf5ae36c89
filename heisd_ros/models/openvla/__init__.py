"""OpenVLA-7B behind the target-VLA interface, built from maintained classes (no remote code).

OpenVLA's published checkpoint (``openvla/openvla-7b`` and its fine-tunes) ships remote code
pinned to transformers 4.40.1 and timm 0.9.x; this subpackage reads the same local directory
with current ``transformers`` classes instead:

- ``vit.py``: the two ViT trunks (DINOv2 ViT-L/14 + 4 registers, SigLIP So400m/14), run up to
  their second-to-last block as Prismatic does;
- ``net.py``: fused vision backbone, projector and ``LlamaForCausalLM``;
- ``config.py``: ``config.json`` -> architecture, user options -> device and precision;
- ``keymap.py`` / ``shards.py``: checkpoint tensor names -> module parameters, shard reading;
- ``processor.py`` / ``prompt.py``: image preprocessing, tokenizer, prompt, action statistics;
- ``adapter.py`` / ``loader.py``: the :class:`~heisd_ros.models.target.TargetVLA` and
  :func:`~heisd_ros.models.openvla.loader.load_target`.

Nothing here touches a model hub: every file comes from the checkpoint directory.
"""
