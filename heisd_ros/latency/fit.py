"""Fit a latency profile from measured decisions, and check what it predicts.

Each stage the decoders time (``StepStats.stage_ms``: vision, retrieval, prefill, draft,
verify, overhead) is fitted on the counters that drive it, by non-negative least squares:

- vision ~ vision_ms x encodings; retrieval ~ retrieval_ms x queries; overhead ~ overhead_ms;
- prefill ~ prefill_base_ms + prefill_per_token_ms x (context + tree tokens of the prefill);
- verify ~ forward_base_ms x later forwards + forward_per_token_ms x their extra tokens;
- draft ~ drafter_forward_ms x draft-head forwards + draft_call_ms x proposals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heisd_ros.latency.counters import DecisionCounters
from heisd_ros.latency.pricing import DeviceTimeline, price
from heisd_ros.latency.profile import LatencyProfile

#: One measured decision: its counters and its stage times (ms).
Sample = tuple[DecisionCounters, dict]


def _nonneg_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``x @ b ~ y`` with ``b >= 0`` (at most a few columns: tries subsets)."""
    n = x.shape[1]
    if len(y) == 0:
        return np.zeros(n)
    best, best_err = np.zeros(n), float(np.sum(y ** 2))
    for mask in range(1, 2 ** n):
        cols = [i for i in range(n) if mask >> i & 1]
        sub = x[:, cols]
        if np.linalg.matrix_rank(sub) < len(cols):
            continue
        coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
        if np.any(coef < 0):
            continue
        err = float(np.sum((sub @ coef - y) ** 2))
        if err < best_err - 1e-12:
            best, best_err = np.zeros(n), err
            best[cols] = coef
    return best


def fit_profile(samples: Sequence[Sample], name: str, description: str = "",
                check_occupies: str = "core", sources: str = "") -> LatencyProfile:
    """A profile whose prices reproduce ``samples``' stage times (see the module docstring).

    Args:
        samples: measured decisions.
        name: the profile's name.
        description: one line on the machine and model.
        check_occupies: ``"core"`` on a CPU with a spare core, ``"device"`` on a GPU.
        sources: how the samples were measured (the command), quoted in every figure's source.
    """
    if not samples:
        raise ValueError("samples: nothing measured to fit a profile on")
    counters = [c for c, _ in samples]
    stage = {k: np.array([float(ms.get(k, 0.0)) for _, ms in samples])
             for k in ("vision", "retrieval", "prefill", "draft", "verify", "overhead")}
    seen = np.array([c.vision > 0 for c in counters])
    vision = float(np.mean(stage["vision"][seen])) if seen.any() else 0.0
    queries = np.array([c.retrievals for c in counters], float)
    retrieval = float(stage["retrieval"].sum() / queries.sum()) if queries.sum() else 0.0
    with_prefill = [i for i, c in enumerate(counters) if c.forwards]
    prefill = _nonneg_fit(np.array([[1.0, sum(counters[i].forwards[0])] for i in with_prefill]
                                   ).reshape(-1, 2), stage["prefill"][with_prefill])
    later = [i for i, c in enumerate(counters) if len(c.forwards) > 1]
    forward = _nonneg_fit(np.array([[len(counters[i].forwards) - 1,
                                     sum(a + b - 1 for a, b in counters[i].forwards[1:])]
                                    for i in later], float).reshape(-1, 2),
                          stage["verify"][later])
    drafting = [i for i, c in enumerate(counters) if c.draft_calls]
    draft = _nonneg_fit(np.array([[counters[i].drafter_forwards, counters[i].draft_calls]
                                  for i in drafting], float).reshape(-1, 2),
                        stage["draft"][drafting])
    how = f"fitted on {len(samples)} measured decisions" + (f" ({sources})" if sources else "")
    return LatencyProfile(
        name=name, description=description, vision_ms=vision,
        prefill_base_ms=float(prefill[0]), prefill_per_token_ms=float(prefill[1]),
        forward_base_ms=float(forward[0]), forward_per_token_ms=float(forward[1]),
        drafter_forward_ms=float(draft[0]), draft_call_ms=float(draft[1]),
        retrieval_ms=retrieval, overhead_ms=float(np.mean(stage["overhead"])),
        check_occupies=check_occupies,
        sources={"vision_ms": f"mean vision stage, {how}",
                 "prefill_base_ms": f"prefill stage against its tokens, {how}",
                 "forward_base_ms": f"verify stage against later forwards and tokens, {how}",
                 "drafter_forward_ms": f"draft stage against head forwards and proposals, {how}",
                 "retrieval_ms": f"retrieval stage per query, {how}",
                 "overhead_ms": f"mean of the rest of each decision, {how}"},
        assumptions=("the decoding model's own prompt length (prompt_tokens null)",
                     "each stage's time is linear in its counters",
                     f"a check behind holds the {check_occupies}"))


def prediction(steps_by_method: dict[str, list[dict]], profile: LatencyProfile) -> dict:
    """Predicted against measured mean step latency per method (step records, in run order).

    ``predicted_ms`` prices each decision alone; ``predicted_with_waits_ms`` places the
    decisions back to back on a :class:`DeviceTimeline` (as a lockstep run or a bench runs
    them), so a check behind that is still running delays the next one. ``error`` compares
    the latter with ``measured_ms`` (the stage clock's total).
    """
    out = {}
    for name, steps in steps_by_method.items():
        steps = [s for s in steps if "counters" in s and "stage_ms" in s]
        if not steps:
            continue
        timeline, t_s, alone, waited = DeviceTimeline(profile), 0.0, [], []
        for s in steps:
            alone.append(price(s["counters"], profile).total_ms)
            decision = timeline.decide(t_s, s["counters"])
            waited.append(decision.latency_ms)
            t_s += decision.latency_ms / 1e3
        measured = float(np.mean([s["stage_ms"]["total"] for s in steps]))
        predicted = float(np.mean(waited))
        out[name] = {"steps": len(steps), "measured_ms": measured,
                     "predicted_ms": float(np.mean(alone)),
                     "predicted_with_waits_ms": predicted,
                     "error": predicted / measured - 1.0 if measured > 0 else None}
    return out


def fit_and_save(steps_by_method: dict[str, list[dict]], path, *, name: str, description: str,
                 check_occupies: str, command: str, machine: str) -> dict:
    """Fit a profile to step records (``counters`` + ``stage_ms``), write it to ``path``.

    Returns {"path", "profile" (its dict), "prediction" (:func:`prediction` of the same steps)}.
    ``command`` and ``machine`` go into the file's header and every figure's source.
    """
    from pathlib import Path

    from heisd_ros.latency.profile import save_profile

    samples = [(DecisionCounters.from_dict(s["counters"]), s["stage_ms"])
               for steps in steps_by_method.values() for s in steps]
    profile = fit_profile(samples, name=name, description=description,
                          check_occupies=check_occupies, sources=command)
    save_profile(profile, path, header=f"Fitted by {command}\nMachine: {machine}")
    return {"path": str(Path(path)), "profile": profile.to_dict(),
            "prediction": prediction(steps_by_method, profile)}
