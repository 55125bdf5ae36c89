"""The decoder interface: one ``decode(observation)`` call, one result type.

Every decoder (``ActionDecoder``: AR and draft-head SD; ``HybridDecoder``: the retrieval
methods; ``TaskRoutedDecoder``: router statistics per task) is a :class:`Decoder` and returns
an :class:`ActionResult`. A plain decode has no path record (``record`` None): its router mode
is off, nothing was skipped, its status is empty. The HybridStep fields of a result come from
:meth:`ActionResult.msg_fields`, the one conversion the node and the tools share.

The ``msg/HybridStep.msg`` constants are declared here and nowhere else. Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from heisd_ros.decoding.stats import STAGES, StepStats

if TYPE_CHECKING:
    from heisd_ros.data.observation import Observation
    from heisd_ros.decoding.behind import CheckVerdict

# HybridStep.msg constants: router_mode, draft_source, behind_result.
ROUTER_DRAFTER, ROUTER_RETRIEVAL, ROUTER_OFF = 0, 1, 2
DRAFT_NONE, DRAFT_DRAFTER, DRAFT_RETRIEVAL = 0, 1, 2
BEHIND_NONE, BEHIND_CONFIRMED, BEHIND_REJECTED = 0, 1, 2
#: router_mode -> the name reports use.
ROUTER_MODE_NAMES = {ROUTER_DRAFTER: "drafter", ROUTER_RETRIEVAL: "retrieval", ROUTER_OFF: "off"}
#: draft_source -> its name.
DRAFT_SOURCE_NAMES = {DRAFT_RETRIEVAL: "retrieval", DRAFT_DRAFTER: "drafter", DRAFT_NONE: "none"}


@dataclass
class HybridStepRecord:
    """Which path one step took and why; field names follow ``msg/HybridStep.msg``."""

    router_mode: int = ROUTER_OFF
    fused_metric: float = float("nan")
    curvature_term: float = float("nan")
    displacement_term: float = float("nan")
    curvature_radius_m: float = float("nan")
    displacement_m: float = float("nan")
    router_threshold: float = float("nan")
    draft_source: int = DRAFT_NONE
    verify_skipped: bool = False
    unverified_run: int = 0   # unverified steps in a row including this one (0: verified)
    skip_rule: str = ""       # what allowed an unverified step ("similarity", "follow", "router")
    skip_similarity: float = float("nan")
    skip_threshold: float = float("nan")
    checked_behind: bool = False   # this unverified action is being checked by the target
    behind_result: int = BEHIND_NONE   # the previous step's check, collected at this step
    behind_bin_difference: int = -1    # its teacher-forced sum of |bin differences|
    behind_wait_ms: float = 0.0        # how long this step waited for it
    behind_check_ms: float = float("nan")   # how long its forward took
    accepted_tokens: int = 0
    accepted_length_per_round: list[int] = field(default_factory=list)
    first_error_position: int = -1
    target_forwards: int = 0
    drafter_forwards: int = 0
    retrieval_calls: int = 0
    action_bins: list[int] = field(default_factory=list)
    action: list[float] = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)
    status: str = ""     # empty when normal; else why the step degraded
    why: str = ""        # always: the decision trail, for logs

    def to_msg_fields(self) -> dict:
        """HybridStep fields (``<stage>_ms`` flattened; ``why`` dropped)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("stage_ms", "why")}
        out.update({f"{s}_ms": float(self.stage_ms.get(s, 0.0)) for s in STAGES})
        return out


@dataclass(frozen=True)
class ActionResult:
    """One decoded action, from any decoder.

    Attributes:
        tokens: (7,) action token ids.
        bins: (7,) bins 0..255.
        action: (7,) physical action (m, rad, gripper 0/1) from the decoder's codec.
        hidden: (7, H) last-layer hidden state (lm_head input) that predicted each token;
            None when the step ran without the target (verify-skipped).
        vision_features: (n_cameras, D) pooled vision features (retrieval DB embedding input).
        stats: counters and stage latencies.
        record: the path record of a hybrid decoder's step; None for a plain decode.
        behind: the verdict on the previous step's action collected at this step
            (``heisd_behind``), else None.
    """

    tokens: np.ndarray
    bins: np.ndarray
    action: np.ndarray
    hidden: Any
    vision_features: Any
    stats: StepStats
    record: HybridStepRecord | None = None
    behind: CheckVerdict | None = None

    @property
    def router_mode(self) -> int:
        """HybridStep ``router_mode`` (``ROUTER_OFF`` without a record)."""
        return self.record.router_mode if self.record is not None else ROUTER_OFF

    @property
    def verify_skipped(self) -> bool:
        """Whether the action ran without the target (never for a plain decode)."""
        return self.record is not None and bool(self.record.verify_skipped)

    @property
    def status(self) -> str:
        """Why the step degraded ("" when it did not, always for a plain decode)."""
        return self.record.status if self.record is not None else ""

    def msg_fields(self) -> dict[str, Any]:
        """The HybridStep fields of this step (the record's; a plain decode's counters).

        A plain decode has no router (``ROUTER_OFF``) and its draft source is the draft head
        when it drafted; its ``<stage>_ms`` are the stages it timed.
        """
        if self.record is not None:
            return self.record.to_msg_fields()
        stats = self.stats
        return {"router_mode": ROUTER_OFF,
                "draft_source": DRAFT_DRAFTER if stats.draft_source else DRAFT_NONE,
                "verify_skipped": False, "accepted_tokens": stats.tokens_from_draft,
                "accepted_length_per_round": list(stats.accepted_lengths),
                "first_error_position": stats.first_error_position,
                "target_forwards": stats.target_forwards,
                "drafter_forwards": stats.drafter_forwards,
                "retrieval_calls": stats.retrieval_calls,
                **{f"{k}_ms": float(v) for k, v in stats.stage_ms.items()}}


class Decoder:
    """What every decoder offers: ``decode`` one action; episodes for those that keep state.

    Attributes:
        description: what runs, with which files (for logs and diagnostics); "" = unsaid.
        degraded: "" while the decoder runs as asked; else why it runs as something less.
        path_pricing: prices a decode path's work for decoders that choose between exact
            paths by cost (``HybridDecoder``); None: the measured stage times.
    """

    description: str = ""
    degraded: str = ""
    path_pricing = None

    def decode(self, observation: Observation) -> ActionResult:
        """Decode one action of ``observation``."""
        raise NotImplementedError

    def begin_episode(self, task: str | None = None) -> None:
        """A new episode of ``task`` starts (nothing is kept between actions by default)."""

    def episode_end(self, success: bool) -> float | None:
        """The episode ended with ``success`` (nothing adapts by default)."""
        return None

    def collect_check(self) -> CheckVerdict | None:
        """The verdict of a check behind still pending on the last action (None: none)."""
        return None
