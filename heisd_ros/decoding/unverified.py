"""Steps executed without the target VLA: when they are allowed, and their bounds.

An unverified step executes a retrieved demonstration action with no LLM forward (vision and
retrieval still run). Three rules may allow one (``HybridStepRecord.skip_rule``):

* ``similarity`` (``router_skip``, ``heisd``): the best candidate's cosine similarity reaches
  the calibrated skip threshold (the verify-skip of the paper's ablation);
* ``follow`` (``heisd``, ``heisd_ar``): the last executed action came from demonstration point
  (episode e, step s), either verified (the target accepted exactly that action) or
  unverified, and the current frame's retrieval returns that demonstration's next point
  (e, s + 1), or one of the next ``follow_window`` points, among its candidates with
  similarity >= ``follow_min_similarity``; the arm moved over the last step as the
  demonstration did (within ``follow_drift_m``), and the demonstration
  does not change the gripper at its next step (the approach to a grasp is verified). So the
  robot follows a retrieved action chunk while the scene keeps matching it, and stops at once
  when it drifts, when the router leaves retrieval mode, or when the match is lost;
* ``router`` (``heisd_paper``, the authors' released rule): every step the router gives to
  the DB executes the top candidate.

Every rule is bounded the same way (:func:`unverified_problem`): at most ``max_run`` (the
authors' rule: ``paper_max_run``) unverified steps in a row, then a verified one; never with
the gripper state unknown, never changing it; never beyond the driver's per-command bounds
(``max_translation_m``, ``max_rotation_rad``). The policy node marks such a command
``SOURCE_RETRIEVAL_SKIP``; HybridStep carries ``verify_skipped``, ``unverified_run`` and
``skip_rule``. Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from heisd_ros.data.observation import ACTION_DIM, GRIPPER_CLOSED_ABOVE, EpisodeState

GRIPPER_DIM = ACTION_DIM - 1
#: ``skip_rule`` values (``deadline``: a verified step completed at its forward budget,
#: ``heisd_deadline``; it ran target forwards, so it is not ``verify_skipped``).
RULE_SIMILARITY, RULE_FOLLOW, RULE_ROUTER = "similarity", "follow", "router"
RULE_DEADLINE = "deadline"


@dataclass(frozen=True)
class UnverifiedConfig:
    """Bounds of unverified execution and the ``follow`` rule's tolerances.

    Attributes:
        max_run: unverified steps in a row (any rule but ``router``) before a verified one
            (2: the best success and speed of 0..4 on closed-loop validation episodes,
            docs/results/2026-12-03-unverified-steps-validation.md).
        paper_max_run: the same for ``heisd_paper`` (the authors' N = 2).
        behind_max_run: the same for ``heisd_behind``, whose unverified actions the target
            checks while they execute (a rejection ends the run at the next step). 8: on
            closed-loop validation episodes 4 and 8 ran at the same speed and success (23 and
            24 of 30); 8 with ``behind_router_gate`` off was best (26 of 30, 1.72x against
            1.62x; docs/results/2026-12-04-checks-behind.md).
        behind_router_gate: ``heisd_behind``: whether only steps the router gives to
            retrieval (F above its threshold) may run unverified, as in ``heisd``. False: any
            step once the router's window is full, the check behind catching a wrong action
            within a step (validation as above).
        deadline_forwards: ``heisd_deadline``: target forwards a verified step with a
            retrieval draft may run before it completes its action from the draft (the rest
            is verified behind). 1: at the shipped profile ``openvla-7b-paper`` one forward
            lands within the 100 ms control period (vision 8 + overhead 53 + retrieval 5.1 +
            prefill about 31 = 97 ms) and a second does not (about 111 ms).
        follow_window: how many steps ahead in the followed demonstration a retrieved point
            may be (1: only its next point; more lets an arm faster than it catch up).
        follow_min_similarity: the demonstration's next point must be retrieved at least
            this similar (cosine) to the current frame. 0.90: on closed-loop validation
            episodes 0.97, 0.95, 0.93, 0.90 and 0.85 gave ``heisd`` 23, 25, 25, 27 and 26
            successes of 30 at 1.43x, 1.68x, 1.74x, 1.82x and 1.91x by mean; 0.85 ran barely
            more steps unverified (39% against 38%), so the stricter value is kept
            (docs/results/2026-12-03-follow-threshold-validation.md).
        follow_drift_m: largest difference between the arm's last displacement and the
            demonstration's at the same step, metres.
        max_translation_m: largest translation of an unverified action, metres (the PIPER
            driver's per-command limit).
        max_rotation_rad: largest rotation (norm of droll, dpitch, dyaw) of one, radians.
    """

    max_run: int = 2
    paper_max_run: int = 2
    behind_max_run: int = 8
    behind_router_gate: bool = False
    deadline_forwards: int = 1
    follow_window: int = 2
    follow_min_similarity: float = 0.90
    follow_drift_m: float = 0.01
    max_translation_m: float = 0.02
    max_rotation_rad: float = 0.15

    def overridden(self, max_run: int | None = None,
                   follow_min_similarity: float | None = None) -> UnverifiedConfig:
        """This config with other limits (None: that one kept).

        ``max_run``: most unverified steps in a row, for every rule; ``follow_min_similarity``:
        the follow rule's threshold.
        """
        changes: dict = {}
        if max_run is not None:
            changes.update(max_run=max_run, paper_max_run=max_run, behind_max_run=max_run)
        if follow_min_similarity is not None:
            changes["follow_min_similarity"] = float(follow_min_similarity)
        return replace(self, **changes)

    def __post_init__(self) -> None:
        """Refuse negative counts and non-finite or negative bounds."""
        if isinstance(self.follow_window, bool) or not isinstance(self.follow_window, int) \
                or self.follow_window < 1:
            raise ValueError(f"follow_window: expected an int >= 1, got {self.follow_window!r}")
        for name in ("max_run", "paper_max_run", "behind_max_run"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        budget = self.deadline_forwards
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"deadline_forwards: expected an int >= 1 (the prefill), got "
                             f"{budget!r}")
        if not (math.isfinite(self.follow_min_similarity)
                and -1.0 <= self.follow_min_similarity <= 1.0):
            raise ValueError(f"follow_min_similarity: expected a cosine in [-1, 1], got "
                             f"{self.follow_min_similarity}")
        for name in ("follow_drift_m", "max_translation_m", "max_rotation_rad"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite value >= 0, got {value}")


@dataclass(frozen=True)
class Anchor:
    """The demonstration point the last executed action came from."""

    task: str
    episode: int
    step: int
    ee_position_m: np.ndarray

    @classmethod
    def of(cls, candidate) -> Anchor:
        """The anchor of a retrieved ``Candidate``."""
        r = candidate.record
        return cls(str(r.task), int(r.episode), int(r.step),
                   np.asarray(r.ee_position_m, dtype=np.float64))

    def ahead(self, candidate) -> int:
        """Steps from this point to ``candidate`` in the same demonstration (0: another one)."""
        r = candidate.record
        if (str(r.task), int(r.episode)) != (self.task, self.episode):
            return 0
        return max(0, int(r.step) - self.step)

    def next_point(self, candidates, window: int):
        """The most similar of ``candidates`` 1..``window`` steps ahead in this demonstration.

        An arm slightly faster than the demonstration matches a point further on; None when
        none of them was retrieved.
        """
        ahead = [c for c in candidates if 1 <= self.ahead(c) <= window]
        return max(ahead, key=lambda c: c.score) if ahead else None


@dataclass(frozen=True)
class Trail:
    """What the decoder knows before deciding step ``step_index`` of an episode.

    ``run``: unverified steps executed in a row just before it; ``anchor``: the demonstration
    point the last executed action came from (None: it came from no single point);
    ``ee_position_m``: the arm's position when that action was decided (None: unknown).
    """

    step_index: int
    run: int = 0
    anchor: Anchor | None = None
    ee_position_m: np.ndarray | None = None


def unverified_problem(action: np.ndarray, episode: EpisodeState | None, run: int,
                       max_run: int, config: UnverifiedConfig) -> str:
    """Why ``action`` (7-D, physical units) may not run unverified now; "" if it may."""
    if run >= max_run:
        return f"{run} unverified step(s) in a row: this one is verified"
    known = episode.gripper_closed if episode is not None else None
    if known is None:
        return "the gripper state is unknown"
    if (float(action[GRIPPER_DIM]) > GRIPPER_CLOSED_ABOVE) != known:
        return "the action would change the gripper"
    translation = float(np.linalg.norm(action[:3]))
    if not translation <= config.max_translation_m:  # NaN-safe
        return (f"translation {translation * 1e3:.1f} mm beyond the unverified bound "
                f"{config.max_translation_m * 1e3:.1f} mm")
    rotation = float(np.linalg.norm(action[3:6]))
    if not rotation <= config.max_rotation_rad:
        return (f"rotation {rotation:.3f} rad beyond the unverified bound "
                f"{config.max_rotation_rad:.3f} rad")
    return ""


def follow_problem(anchor: Anchor | None, candidate, next_gripper: float | None,
                   moved_m: np.ndarray | None, episode: EpisodeState | None,
                   config: UnverifiedConfig) -> str:
    """Why the ``follow`` rule does not take ``candidate`` now; "" if it does.

    Args:
        anchor: the demonstration point the last executed action came from.
        candidate: the retrieved demonstration's next point (None: not retrieved).
        next_gripper: the gripper value of the demonstration's action after ``candidate``'s
            (None: the demonstration ends there).
        moved_m: the arm's displacement over the last step (None: unknown).
        episode: the episode state (the executed gripper).
        config: tolerances.
    """
    if anchor is None:
        return "the last action came from no retrieved demonstration point"
    if candidate is None:
        return (f"the demonstration's next points ({anchor.task} episode {anchor.episode} "
                f"after step {anchor.step}) are not among the retrieved")
    if not candidate.score >= config.follow_min_similarity:  # NaN-safe
        return (f"the demonstration's next point is {candidate.score:.4f} similar, below "
                f"{config.follow_min_similarity:.4f}")
    if moved_m is None:
        return "the arm's last displacement is unknown"
    demo_moved = np.asarray(candidate.record.ee_position_m, np.float64) - anchor.ee_position_m
    drift = float(np.linalg.norm(np.asarray(moved_m, np.float64) - demo_moved))
    if not drift <= config.follow_drift_m:
        return (f"the arm drifted {drift * 1e3:.1f} mm from the demonstration's path (max "
                f"{config.follow_drift_m * 1e3:.1f} mm)")
    known = episode.gripper_closed if episode is not None else None
    if next_gripper is not None and known is not None and \
            (next_gripper > GRIPPER_CLOSED_ABOVE) != known:
        return "the demonstration changes the gripper next: the approach is verified"
    return ""
