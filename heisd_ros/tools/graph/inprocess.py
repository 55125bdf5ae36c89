"""The policy node's decoder in this process, on the observations the node decoded.

After a method's graph phase (its processes stopped: the retrieval node locks the embedded
DB), the decoder is built here the way the decode worker builds it
(``heisd_ros.nodes.policy_decoders``, which calls ``heisd_ros.decoding.builder``) and decodes
the node's observations in the node's order (:func:`inprocess_order`).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import fields

from heisd_ros.tools.graph.listener import STAGES
from heisd_ros.tools.graph.replay import Replay, state_messages


class InProcess:
    """The policy's decoder in this process, on the replay's observations."""

    def __init__(self) -> None:
        self._targets: dict[tuple, tuple] = {}

    def run(self, method: str, model: dict, store: dict | None, replay: Replay,
            order: list[int], advance: bool, warmup: int) -> dict:
        """Decode ``order``'s observations; per decode the wall-clock and total_ms.

        ``advance``: the episode state advances after each decode (the node sent them).
        """
        from dataclasses import asdict

        from heisd_ros.data.episode import make_proprio
        from heisd_ros.data.observation import EpisodeState, Observation
        from heisd_ros.nodes.policy_decoders import ModelConfig, build_decoder, load_target
        from heisd_ros.nodes.policy_decoders import warm_up as warm_target
        from heisd_ros.nodes.robot_msgs import pose_from_msg

        config = ModelConfig(**{f.name: model[f.name] for f in fields(ModelConfig)
                                if f.name in model})
        key = tuple(sorted(asdict(config).items()))
        if key not in self._targets:
            target, _ = load_target(config)  # sets torch's threads to model.threads
            warm_target(target)
            self._targets = {key: (target,)}
        target, = self._targets[key]
        opened = retriever = None
        if store is not None:
            from heisd_ros.decoder_loader import open_warm_store
            from heisd_ros.retrieval.retriever import Retriever, RetrieverConfig
            from heisd_ros.retrieval.store_config import StoreConfig

            cfg = StoreConfig(**{f.name: store[f.name] for f in fields(StoreConfig)
                                 if f.name in store})
            opened = open_warm_store(cfg, target, [replay.task] if replay.task else None)
            retriever = Retriever(opened, RetrieverConfig(k=config.retrieval_k, demote_steps=0))
        try:
            decoder = build_decoder(method, target, config, retriever,
                                    warn=lambda text: print(f"[in-process] {method}: {text}",
                                                            file=sys.stderr))
            task = replay.task or None

            def observation(index: int, episode) -> Observation:
                joint, pose = state_messages(replay.states[index])
                position, rpy = pose_from_msg(pose)  # as the node reads its robot state
                return Observation(replay.third[index], replay.wrist[index],
                                   replay.instruction,
                                   make_proprio(position, rpy, joint.position[6]),
                                   float(index), episode)

            for index in order[:warmup]:
                decoder.decode(observation(index, EpisodeState(task)))
            wall_ms, total_ms, skipped, stages, previous = [], [], [], [], None
            episode = EpisodeState(task)
            for index in order:
                if previous is None or replay.episode[index] != replay.episode[previous]:
                    decoder.begin_episode(task)
                    episode = EpisodeState(task)
                obs = observation(index, episode)
                t = time.perf_counter()
                step = decoder.decode(obs)
                wall_ms.append((time.perf_counter() - t) * 1e3)
                total_ms.append(float(step.fields.get("total_ms", math.nan)))
                skipped.append(bool(step.fields.get("verify_skipped")))
                stages.append({k: float(step.fields.get(k, math.nan)) for k in STAGES})
                if advance:
                    episode = episode.executed(step.action)
                previous = index
            import torch

            return {"wall_ms": wall_ms, "total_ms": [t for t in total_ms if math.isfinite(t)],
                    "indices": list(order), "verify_skipped": skipped, "stages": stages,
                    "threads": torch.get_num_threads(),
                    "decoder": getattr(decoder, "description", "")}
        finally:
            if opened is not None:
                opened.close()


def inprocess_order(phase: dict, n_replay: int, limit: int) -> tuple[list[int], bool, str]:
    """(indices to decode, advance the episode, how chosen) from a graph phase's steps."""
    sent = [i for i in phase.get("hybrid_indices", []) if i is not None]
    if sent:
        return sent[:limit], True, (f"in-process decoded the {min(len(sent), limit)} "
                                    f"observations the node sent commands for, in its order")
    count = min(len(phase.get("held_ms", [])) or 20, limit)
    start = phase.get("start_index", 0)
    return ([(start + k) % n_replay for k in range(count)], False,
            f"no command sent: in-process decoded {count} consecutive replayed observations")
