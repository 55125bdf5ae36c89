"""Decoding: AR, draft trees, tree verification, acceptance rules, speculative decoders.

- The token tree every draft source produces is ``heisd_ros.models.draft_tree.DraftTree``
  (the target verifies it, so it sits below both).
- ``draft_source``: :class:`DraftSource` (``propose`` / ``feedback``), :class:`DraftContext`.
- ``acceptance``: :class:`VerifyView`, ``exact_rule``, :class:`RelaxedRule`.
- ``step``: ``speculative_step``, one verify-accept-commit-bonus round.
- ``interface``: :class:`Decoder` (one ``decode(observation)``), :class:`ActionResult` (one
  result type; a plain decode has no path record) and the HybridStep constants.
- ``decoder``: :class:`ActionDecoder` (AR baseline or speculative with any source).
- ``drafter_source``: the EAGLE-2 dynamic-tree drafter; ``retrieval_tree``: group trees.
- ``retrieval_source``: :class:`RetrievalSource`, group-tree drafts from a retrieval client.
- ``methods``: the table of decoding methods by name (pure data; every front end reads it);
  ``builder``: ``build_decoder(method, resources)``, the one builder every front end calls
  (with resources from the one loader beside this package, ``heisd_ros.decoder_loader``).
- ``task_routed``: :class:`TaskRoutedDecoder`, a router method whose statistics follow the task.
- ``hybrid``: :class:`HybridDecoder` (router, verify-skip, sequence-wise acceptance, fallbacks)
  and ``build_hybrid_decoder(method, target, ...)``.
- ``stats``: :class:`StepStats` counters and the stage clock; ``bench_runner``: heisd-bench.
- ``hf_reference``: greedy decoding through ``transformers.generate`` (a test oracle).
"""
