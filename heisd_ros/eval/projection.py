"""Projection of measured decoding counters to OpenVLA-7B on a GPU (not a measurement).

Per action the projected latency is

    vision + other + target_forwards * llm_forward + drafter_forwards * drafter_forward
        + retrievals * retrieval

with the paper's per-component costs for OpenVLA-7B (vision 8 ms, one LLM forward 13.93 ms,
retrieval 5.13 ms, other 53 ms per step). The draft-head forward cost is not given there and
is an assumption (one LLaMA decoder layer of the 7B model plus launch overhead). A tree
verification forward is assumed to cost one LLM forward (decoding is memory-bound at batch
1). Verify-skipped steps enter through their lower target-forward count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Forwards per action of AR decoding (prefill + 6 decode forwards for 7 tokens).
AR_TARGET_FORWARDS = 7.0


@dataclass(frozen=True)
class ComponentCosts:
    """Per-component latency in ms on the projected setting.

    Attributes:
        vision_ms: vision encoder + projector, once per step.
        llm_forward_ms: one forward of the 7B language model.
        retrieval_ms: one vector-DB query.
        other_ms: everything else per step (pre/post-processing, transfer).
        drafter_forward_ms: one draft-head forward (ASSUMPTION, not from the paper).
    """

    vision_ms: float = 8.0
    llm_forward_ms: float = 13.93
    retrieval_ms: float = 5.13
    other_ms: float = 53.0
    drafter_forward_ms: float = 1.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value >= 0.0:
                raise ValueError(f"{name}: expected a cost >= 0 ms, got {value}")


def projected_ms(counters: dict, costs: ComponentCosts) -> float:
    """Projected ms per action from per-action counters.

    Args:
        counters: ``target_forwards_per_action``, ``drafter_forwards_per_action`` and
            ``retrievals_per_action`` (means over actions).
        costs: component costs.
    """
    return (costs.vision_ms + costs.other_ms
            + counters["target_forwards_per_action"] * costs.llm_forward_ms
            + counters.get("drafter_forwards_per_action", 0.0) * costs.drafter_forward_ms
            + counters.get("retrievals_per_action", 0.0) * costs.retrieval_ms)


def project(methods: dict[str, dict], costs: ComponentCosts | None = None,
            reference: str = "ar") -> dict:
    """Projected ms per action and speed-up vs AR of every method.

    Args:
        methods: method name -> counters (see :func:`projected_ms`; ``skip_rate`` optional).
        costs: component costs (default: the paper's, drafter assumed 1 ms).
        reference: the AR method's name; its counters are used when present, else the
            nominal 7 forwards per action.

    Returns:
        {"label", "costs_ms", "assumptions", "methods": {name: {projected_ms_per_action,
        projected_speedup_vs_ar, counters used}}}.
    """
    costs = costs or ComponentCosts()
    ref = methods.get(reference, {"target_forwards_per_action": AR_TARGET_FORWARDS})
    ref_ms = projected_ms(ref, costs)
    rows = {}
    for name, c in methods.items():
        ms = projected_ms(c, costs)
        rows[name] = {"projected_ms_per_action": ms, "projected_speedup_vs_ar": ref_ms / ms,
                      "target_forwards_per_action": c["target_forwards_per_action"],
                      "drafter_forwards_per_action": c.get("drafter_forwards_per_action", 0.0),
                      "retrievals_per_action": c.get("retrievals_per_action", 0.0),
                      "skip_rate": c.get("skip_rate", 0.0)}
    return {"label": "PROJECTION to OpenVLA-7B on a GPU from measured counters (not measured)",
            "costs_ms": asdict(costs),
            "assumptions": [
                "per-component costs from the HeiSD paper (OpenVLA-7B): vision, one LLM "
                "forward, retrieval, other per step",
                f"draft-head forward {costs.drafter_forward_ms} ms is an assumption",
                "a tree verification forward costs one LLM forward (memory-bound decoding)",
                "vision and other costs are paid every step, also when verification is skipped"],
            "methods": rows}
