"""Projection of measured decoding counters to another machine (not a measurement).

Every decoded action's counters (``counters`` in its step record: vision, the prefill and its
tokens, the later forwards and their tree sizes, draft-head forwards, retrievals) are priced
by a latency profile (``heisd_ros.latency``), by the same cost function real-time evaluation
at that profile uses; a method's projected ms per action is the mean over its actions. The
default profile is ``openvla-7b-paper``: OpenVLA-7B on a GPU from the HeiSD paper's figures,
every assumption named in its file.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.latency.pricing import PARTS, price
from heisd_ros.latency.profile import LatencyProfile, load_profile

#: The profile a projection uses unless told otherwise.
DEFAULT_PROFILE = "openvla-7b-paper"


def projected_parts(steps: list[dict], profile: LatencyProfile) -> dict[str, float]:
    """Mean priced ms per action of each part and their ``total``.

    ``steps``: step records carrying ``counters``; the parts are
    ``heisd_ros.latency.pricing.PARTS``.
    """
    if not steps:
        raise ValueError("steps: nothing to project")
    priced = [price(s["counters"], profile) for s in steps]
    out = {part: float(np.mean([p.parts[part] for p in priced])) for part in PARTS}
    out["total"] = float(np.mean([p.total_ms for p in priced]))
    return out


def project(steps_by_method: dict[str, list[dict]],
            profile: LatencyProfile | str = DEFAULT_PROFILE, reference: str = "ar") -> dict:
    """Projected ms per action and speed-up vs AR of every method.

    Args:
        steps_by_method: method name -> its step records (each with ``counters``).
        profile: the profile (or its name / path) to price them with.
        reference: the AR method's name; its steps are the reference (a method list without
            it gets no speed-up).

    Returns:
        {"label", "profile", "costs_ms", "assumptions", "methods": {name: {
        projected_ms_per_action, projected_speedup_vs_ar (None without a reference or at 0 ms),
        parts_ms, target_forwards_per_action, drafter_forwards_per_action,
        retrievals_per_action, skip_rate}}}.
    """
    profile = load_profile(profile)
    rows = {}
    for name, steps in steps_by_method.items():
        if not steps:
            continue
        parts = projected_parts(steps, profile)
        counters = [s["counters"] for s in steps]
        rows[name] = {"projected_ms_per_action": parts["total"], "parts_ms": parts,
                      "target_forwards_per_action": float(np.mean(
                          [len(c["forwards"]) for c in counters])),
                      "drafter_forwards_per_action": float(np.mean(
                          [c["drafter_forwards"] for c in counters])),
                      "retrievals_per_action": float(np.mean(
                          [c["retrievals"] for c in counters])),
                      "skip_rate": float(np.mean([bool(c["unverified"]) for c in counters]))}
    ref = rows.get(reference)
    for row in rows.values():
        row["projected_speedup_vs_ar"] = (ref["projected_ms_per_action"]
                                          / row["projected_ms_per_action"]
                                          if ref is not None and row["projected_ms_per_action"]
                                          else None)
    costs = {k: v for k, v in profile.to_dict().items()
             if k.endswith("_ms") and isinstance(v, float)}
    return {"label": f"PROJECTION to {profile.description or profile.name} (profile "
                     f"{profile.name}) from measured counters (not measured)",
            "profile": profile.name, "costs_ms": costs,
            "assumptions": list(profile.assumptions)
            + ["a check behind is not in the mean: it runs after the command (real-time "
               "evaluation at the profile charges the wait it causes)"],
            "methods": rows}
