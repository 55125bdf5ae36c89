"""Training: behaviour cloning of the small VLA, its auxiliary stages, the draft head.

- ``demo_cache``: the demonstration steps in memory (images at the model's resolution), the
  held-out split.
- ``vla_training``: the action loss, the trainer and the closed-loop check of a run.
- ``vision_pretraining``: the auxiliary vision objective (its own stage and a weighted loss).
- ``subgoal``: the subgoal pathway's targets and its own stage.
- ``draft_training``: self-distillation of the draft head on the target's greedy rollouts.

Inference (``models``, ``decoding``, ``retrieval``, ``nodes``, ``sim``, ``eval``) never
imports this package; ``heisd-train-vla`` and ``heisd-train-drafter`` do.
"""
