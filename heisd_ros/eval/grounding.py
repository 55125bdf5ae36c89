"""Does a policy go to the object its instruction names? Two open-loop probes on piper_object.

piper_object puts four objects in shuffled slots and names one in the instruction, so the
same scene with each of the four instructions asks four questions. Both probes run in
seconds, where closed-loop success needs minutes and tells apart only large differences:

* :func:`first_action_alignment`: the cosine between the first action's xy translation and the
  direction from the hand to the named object (1 = straight at it). A policy that ignores the
  object word moves the same way for every instruction and scores about what a fixed
  direction does (the shipped model: 0.49 on seeds 100-105).
* :func:`pathway_probe`: for a model with a subgoal pathway (``small_vla.SubgoalPathway``), is
  the object nearest to its predicted grasp point (current hand + first subgoal) the named one.

Usage::

    python -c "from heisd_ros.eval.grounding import report; \
print(report('runs/p4/small_vla.safetensors'))"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import torch

SUITE = "piper_object"
OBJECTS = ("red_block", "green_can", "blue_bar", "yellow_block")


def _scenes(seeds: Iterable[int], image_size_px: int):
    """(seed, env, first observation, {object: instruction}) for each seed (one shared env)."""
    from heisd_ros.sim.config import SimConfig
    from heisd_ros.sim.env import PiperSimEnv
    from heisd_ros.sim.suites import get_task

    tasks = {name: get_task(SUITE, f"{name}_in_basket") for name in OBJECTS}
    instructions = {name: task.instruction for name, task in tasks.items()}
    config = SimConfig(image_width_px=image_size_px, image_height_px=image_size_px)
    with PiperSimEnv(tasks[OBJECTS[0]], config) as env:
        for seed in seeds:
            yield seed, env, env.reset(seed), instructions


def first_action_alignment(vla, seeds: Iterable[int] = range(100, 106),
                           image_size_px: int = 128) -> dict:
    """Mean and per-case cosine of the first AR action's xy with the way to the named object.

    Returns ``{"mean_cosine", "cases": [{"seed", "object", "cosine", "action_xy_mm"}]}``.
    """
    from heisd_ros.decoding.decoder import ActionDecoder

    decoder = ActionDecoder(vla)
    cases = []
    for seed, env, observation, instructions in _scenes(seeds, image_size_px):
        for name, text in instructions.items():
            action = decoder.decode(dataclasses.replace(observation, instruction=text)).action
            way = env.body_pos(name)[:2] - observation.proprio[:2]
            move = np.asarray(action[:2], np.float64)
            norm = np.linalg.norm(move) * np.linalg.norm(way)
            cases.append({"seed": seed, "object": name,
                          "cosine": float(move @ way / norm) if norm > 0 else 0.0,
                          "action_xy_mm": (1000 * move).round(1).tolist()})
    return {"mean_cosine": float(np.mean([c["cosine"] for c in cases])), "cases": cases}


def pathway_probe(vla, seeds: Iterable[int] = range(100, 108), image_size_px: int = 128) -> dict:
    """How often the subgoal pathway's grasp point is nearest the named object (xy).

    Returns ``{"hits", "cases", "median_distance_mm"}`` (distance from the predicted point
    to the named object).
    """
    from heisd_ros.models.subgoal import SCALE_M

    pathway = vla.net.subgoal
    if pathway is None:
        raise ValueError("pathway_probe: the model has no subgoal pathway "
                         "(heisd-train-vla --subgoal-pathway)")
    hits, distances = 0, []
    for _, env, observation, instructions in _scenes(seeds, image_size_px):
        where = {name: env.body_pos(name)[:2] for name in OBJECTS}
        pixels = pathway.encoder.pixels([observation.image_primary, observation.image_wrist])
        proprio = torch.as_tensor(observation.proprio, dtype=torch.float32)[None]
        for name, text in instructions.items():
            with torch.no_grad():
                subgoals = pathway.predict(pixels[None], pathway.word_ids([text]), proprio)
            point = observation.proprio[:2] + subgoals[0, :2].numpy() * SCALE_M
            gaps = {other: float(np.linalg.norm(point - xy)) for other, xy in where.items()}
            hits += min(gaps, key=gaps.get) == name
            distances.append(gaps[name])
    return {"hits": hits, "cases": len(distances),
            "median_distance_mm": float(1000 * np.median(distances))}


def report(model_path, image_size_px: int = 128) -> dict:
    """Both probes of a checkpoint (the pathway's when it has one)."""
    from heisd_ros.models.checkpoint import load_small_vla

    vla = load_small_vla(model_path)
    result = {"first_action_alignment": first_action_alignment(vla, image_size_px=image_size_px)
              ["mean_cosine"]}
    if vla.net.subgoal is not None:
        result["pathway_probe"] = pathway_probe(vla, image_size_px=image_size_px)
    return result
