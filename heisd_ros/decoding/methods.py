"""The decoding methods by name: what each one uses. Pure data (no torch, no numpy).

Every front end reads this table: the policy node's config and the launch argument
``method`` (``heisd_ros.nodes.graph``, which the launch file imports, so this module must
stay importable without torch), ``heisd-eval --methods``, ``heisd-replay``, ``heisd-record
--policy``, ``heisd-bench decode --methods``, ``heisd_ros demo --ablation``. The decoders
themselves come from :func:`heisd_ros.decoding.builder.build_decoder`.

The ladder (docs/METHOD.md): ``ar``; ``drafter`` (EAGLE-2 drafts, exact); ``drafter_relaxed``
(Spec-VLA radius); ``retrieval`` (pure retrieval SD, exact); ``router_only``; ``router_skip``
(+ verify-skip); ``heisd`` (+ sequence-wise group acceptance, + following a retrieved
demonstration without the VLA while it keeps matching, + retrieval drafts on the router's slow
stretches too, where nothing runs unverified); ``heisd_ar`` (``heisd`` with AR in
place of the draft head); ``heisd_paper`` (the authors' released rule: every step the router
gives to the DB executes the retrieved action unverified, at most 2 in a row);
``heisd_behind`` (``heisd`` whose unverified actions the target checks in the background while
they execute, a rejection forcing the next step verified, so every executed action is checked
before it runs or within one step after); ``heisd_deadline`` (``heisd_behind`` whose verified
steps stop at the forwards that land within the control period: an action still incomplete
then takes the rest from the target's own predictions along the drafted branch nearest its
tokens, and the remaining verification round runs behind while it executes; before the
router's window is full its steps draft from retrieval too, accepted exactly, and are
completed at the deadline like the rest).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Switches:
    """Which components a method uses.

    ``drafts_from_retrieval_when_slow``: a step the router gives to the drafter (low F) still
    drafts from retrieval once the router has its full window; the router's F then decides
    only which steps may run unverified (high F), not which source drafts a verified step.
    Without it the router chooses the draft source, as in the paper.

    ``drafts_from_retrieval_from_start``: the steps before the router has its full window (an
    episode's first ``window - 1``) draft from retrieval too, accepted only where the draft
    equals the target's greedy tokens (the relaxed rule waits for the window); nothing runs
    unverified before it is full. With ``completes_at_deadline`` an action still incomplete
    at the budget is completed and checked behind, as later in the episode. Without it those
    steps are decoded by the drafter or AR alone, which at ``openvla-7b-paper`` take 1.3-2
    control periods each.

    ``checks_behind``: every action that runs unverified is verified by the target on a
    background thread while it executes (``heisd_ros.decoding.behind``); a rejection forces
    the next step verified.

    ``completes_at_deadline`` (with ``checks_behind``): a verified step with a retrieval draft
    runs at most ``UnverifiedConfig.deadline_forwards`` target forwards; if its action is
    still incomplete, the remaining tokens are the target's predictions along the drafted
    branch nearest its own tokens (``heisd_ros.decoding.deadline``), and the round that would
    have verified them runs behind, from the step's own cache (``skip_rule`` ``deadline``).
    """

    drafter: bool
    retrieval: bool
    router: bool
    verify_skip: bool
    sequence_wise: bool
    drafter_relaxed: bool
    follow: bool = False
    router_executes: bool = False
    drafts_from_retrieval_when_slow: bool = False
    drafts_from_retrieval_from_start: bool = False
    checks_behind: bool = False
    completes_at_deadline: bool = False

    @property
    def hybrid(self) -> bool:
        """Whether the method is a ``HybridDecoder`` (it queries a retrieval DB)."""
        return self.retrieval


#: Method name -> its components, in ablation order.
METHODS: dict[str, Switches] = {
    "ar": Switches(False, False, False, False, False, False),
    "drafter": Switches(True, False, False, False, False, False),
    "drafter_relaxed": Switches(True, False, False, False, False, True),
    "retrieval": Switches(False, True, False, False, False, False),
    "router_only": Switches(True, True, True, False, False, False),
    "router_skip": Switches(True, True, True, True, False, False),
    "heisd": Switches(True, True, True, True, True, False, follow=True,
                      drafts_from_retrieval_when_slow=True),
    "heisd_ar": Switches(False, True, True, True, True, False, follow=True,
                         drafts_from_retrieval_when_slow=True),
    "heisd_paper": Switches(True, True, True, False, True, False, router_executes=True),
    "heisd_behind": Switches(True, True, True, True, True, False, follow=True,
                             drafts_from_retrieval_when_slow=True, checks_behind=True),
    "heisd_deadline": Switches(True, True, True, True, True, False, follow=True,
                               drafts_from_retrieval_when_slow=True,
                               drafts_from_retrieval_from_start=True, checks_behind=True,
                               completes_at_deadline=True),
}
#: The names, in ablation order.
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
#: Methods built as ``HybridDecoder`` (they use a retrieval DB when one is given).
HYBRID_METHODS: tuple[str, ...] = tuple(n for n, s in METHODS.items() if s.hybrid)
#: Methods that route with the kinematic router (they need router statistics).
ROUTER_METHODS: tuple[str, ...] = tuple(n for n, s in METHODS.items() if s.router)
#: Methods that use a draft head (the shipped one by default).
HEAD_METHODS: tuple[str, ...] = tuple(n for n, s in METHODS.items() if s.drafter)


def check_method(name: str, option: str = "method") -> str:
    """``name`` if it is a method of :data:`METHODS`; else ValueError listing the valid names.

    The one check of a method name: every front end and config calls it.
    """
    if name not in METHODS:
        raise ValueError(f"{option}: unknown method {name!r}; valid: {', '.join(METHOD_NAMES)}")
    return name


def check_methods(names, option: str = "--methods") -> list[str]:
    """``names`` checked (:func:`check_method`), without repeats, "ar" (the reference) first."""
    names = [check_method(n, option) for n in dict.fromkeys(names)]
    return ["ar"] + [n for n in names if n != "ar"]


def needs_head(methods) -> bool:
    """Whether any of ``methods`` uses a draft head."""
    return any(METHODS[m].drafter for m in methods if m in METHODS)
