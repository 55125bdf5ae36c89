"""Offline calibration of the verify-skip threshold and the router's switching threshold.

HeiSD verify-skip (docs/METHOD.md, component 3): on held-out demonstrations (not in the DB), each
step queries the DB (top-1) and the target verifies that candidate in one forward. Then

- ``skip_threshold``: the lowest retrieval similarity s such that, among held-out steps with
  top-1 similarity >= s, at least ``precision`` of the drafts pass the relaxed sequence-wise
  verification (the group rule, gripper exact), with at least ``min_support`` such steps.
  This is the quantity the online decoder compares (it has no LLM hidden state when it
  skips);
- ``hidden_similarity_threshold``: the paper's relation, reported: the lowest cosine
  similarity of the target's last-layer hidden state (lm_head input before the first action
  token) at which pairs of demo steps of one task have trajectory distance (future EE path
  over ``horizon`` steps, m) <= ``trajectory_tolerance_m`` with the same precision;
- ``router_threshold``: the F that best separates steps whose retrieval draft passes from
  those whose draft fails (Youden's J over F >= t).

The pure functions below take arrays; :func:`collect_samples` runs the target (torch via the
target object only).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from heisd_ros.data.observation import ACTION_DIM
from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig, accepted_group_path


@dataclass(frozen=True)
class CalibrationConfig:
    """Calibration settings.

    Attributes:
        precision: wanted share of skipped drafts that would pass relaxed verification.
        min_support: fewest held-out steps above a threshold for it to count.
        group_accept: the relaxed rule a skipped draft must satisfy.
        trajectory_tolerance_m: "same trajectory" for the hidden-state relation (m).
        horizon: future steps of the EE path compared.
        max_pairs: cap on hidden-state pairs (sampled, seeded).
    """

    precision: float = 0.95
    min_support: int = 10
    group_accept: GroupAcceptConfig = field(default_factory=GroupAcceptConfig)
    trajectory_tolerance_m: float = 0.01
    horizon: int = 4
    max_pairs: int = 20000

    def __post_init__(self) -> None:
        if not 0.0 < self.precision <= 1.0:
            raise ValueError(f"precision: expected 0 < p <= 1, got {self.precision}")
        if self.min_support < 1:
            raise ValueError(f"min_support: expected >= 1, got {self.min_support}")
        if not self.trajectory_tolerance_m > 0:
            raise ValueError(f"trajectory_tolerance_m: expected > 0 m, "
                             f"got {self.trajectory_tolerance_m}")
        if self.horizon < 1 or self.max_pairs < 1:
            raise ValueError(f"horizon/max_pairs: expected >= 1, got {self.horizon}, "
                             f"{self.max_pairs}")


@dataclass(frozen=True)
class VerifySkipCalibration:
    """The calibration file ``heisd-calibrate`` writes and the hybrid decoder loads."""

    skip_threshold: float
    router_threshold: float
    precision_target: float
    skip_precision: float          # achieved on the held-out steps above the threshold
    skip_support: int              # held-out steps above the threshold
    skip_rate: float               # their share of all held-out steps with a candidate
    hidden_similarity_threshold: float
    n_held_out_steps: int
    n_pairs: int
    model_fingerprint: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        if not -1.0 <= self.skip_threshold <= 1.0:
            raise ValueError(f"skip_threshold: expected -1..1, got {self.skip_threshold}")
        if not 0.0 <= self.router_threshold <= 1.0:
            raise ValueError(f"router_threshold: expected 0..1, got {self.router_threshold}")

    def save(self, path: str | Path) -> Path:
        """Write as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in asdict(self).items()}   # strict JSON: NaN -> null
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> VerifySkipCalibration:
        """Read a file written by :meth:`save`; ValueError names the file."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("skip_precision", 0.0) is None:
            data["skip_precision"] = float("nan")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"{path}: not a verify-skip calibration file: {exc}") from exc

    def apply(self, config):
        """A HybridConfig with these thresholds (skip bounds widened to include it)."""
        return replace(config.with_skip_threshold(self.skip_threshold),
                       router=replace(config.router, threshold=self.router_threshold))


def _threshold_curve(scores: np.ndarray, positive: np.ndarray):
    """(threshold, precision, support) of every distinct threshold, highest first.

    A threshold s keeps the steps with score >= s, all ties included.
    """
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    order = np.argsort(-s, kind="stable")
    s, pos = s[order], pos[order]
    hits = np.cumsum(pos)
    for i in range(len(s)):
        if i + 1 < len(s) and s[i + 1] == s[i]:
            continue  # a threshold includes all ties
        yield float(s[i]), float(hits[i] / (i + 1)), i + 1


def precision_threshold(scores: np.ndarray, positive: np.ndarray, precision: float,
                        min_support: int) -> tuple[float, float, int]:
    """Lowest s with precision(positive | score >= s) >= ``precision`` and support >= min.

    Returns (threshold, achieved precision, support); (1.0, nan, 0) when none qualifies
    (skip only identical observations).
    """
    best = (1.0, float("nan"), 0)
    for threshold, prec, support in _threshold_curve(scores, positive):
        if support >= min_support and prec >= precision:
            best = (threshold, prec, support)
    return best


def best_precision(scores: np.ndarray, positive: np.ndarray,
                   min_support: int) -> tuple[float, float, int]:
    """(precision, threshold, support) of the most precise threshold with >= ``min_support`` steps.

    What the data allows when no threshold reaches the wanted precision. (nan, 1.0, 0) when
    there are fewer than ``min_support`` scores.
    """
    best = (float("nan"), 1.0, 0)
    for threshold, prec, support in _threshold_curve(scores, positive):
        if support >= min_support and not prec <= best[0]:  # the first, or more precise
            best = (prec, threshold, support)
    return best


def youden_threshold(values: np.ndarray, positive: np.ndarray, default: float = 0.5) -> float:
    """The t maximising TPR - FPR of the prediction ``value >= t`` (NaN values ignored)."""
    v = np.asarray(values, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    keep = np.isfinite(v)
    v, pos = v[keep], pos[keep]
    if pos.all() or not pos.any():
        return default
    best_t, best_j = default, -np.inf
    for t in np.unique(v):
        pred = v >= t
        j = pred[pos].mean() - pred[~pos].mean()
        if j > best_j:
            best_t, best_j = float(t), j
    return best_t


def draft_passes(candidate_bins: np.ndarray, target_bins: np.ndarray,
                 accept: GroupAcceptConfig) -> bool:
    """Would the group rule accept the whole 7-token draft (target bins along its chain)?"""
    chain = np.arange(ACTION_DIM) - 1
    path = accepted_group_path(chain, candidate_bins, target_bins, np.arange(ACTION_DIM), accept)
    return len(path) == ACTION_DIM


def future_path(ee_m: np.ndarray, t: int, horizon: int) -> np.ndarray:
    """EE displacement over the next ``horizon`` steps from step t (padded at the end), m."""
    ee = np.asarray(ee_m, dtype=np.float64)
    idx = np.minimum(np.arange(t + 1, t + 1 + horizon), len(ee) - 1)
    return (ee[idx] - ee[t]).reshape(-1)


def collect_samples(target, retriever, episodes, router=None, max_steps: int = 0,
                    config: CalibrationConfig | None = None) -> dict[str, np.ndarray]:
    """Per held-out step: top-1 similarity, relaxed/exact pass, F, hidden state, future path.

    Args:
        target: the target VLA.
        retriever: a Retriever over the DB (its demotion off).
        episodes: held-out EpisodeRecords (not in the DB).
        router: a KinematicRouter for F (None: F is NaN).
        max_steps: steps per episode (0 = all).
        config: calibration settings.
    """
    from heisd_ros.models.draft_tree import DraftTree
    from heisd_ros.retrieval.embedding import embedding_from_features

    cfg = config or CalibrationConfig()
    rows: dict[str, list] = {k: [] for k in ("score", "passed", "exact", "fused", "hidden",
                                              "future", "task")}
    for record in episodes:
        fused = (router.fused_series(record.ee_position_m) if router is not None
                 else np.full(record.num_steps, np.nan))
        steps = range(record.num_steps if not max_steps else min(max_steps, record.num_steps))
        for t in steps:
            obs = record.observation(t)
            prefix = target.encode(obs)
            res = retriever.retrieve(record.task, embedding_from_features(prefix.vision_features),
                                     k=1)
            state = target.start(prefix)
            bins = np.asarray(res.candidates[0].bins, np.int64) if res.ok else None
            tree = DraftTree.chain(target.actions.token_of_bin(bins)) if bins is not None \
                else None
            out = target.forward(state, tree)
            rows["hidden"].append(out.context_hidden[-1].float().cpu().numpy())
            rows["future"].append(future_path(record.ee_position_m, t, cfg.horizon))
            rows["task"].append(record.task)
            rows["fused"].append(float(fused[t]))
            if bins is None:
                rows["score"].append(np.nan)
                rows["passed"].append(False)
                rows["exact"].append(False)
                continue
            tb = target.target_bins(out)
            rows["score"].append(float(res.candidates[0].score))
            rows["passed"].append(draft_passes(bins, tb, cfg.group_accept))
            rows["exact"].append(bool(np.array_equal(bins, tb)))
    return {k: np.asarray(v) for k, v in rows.items()}


def hidden_pairs(samples: dict, config: CalibrationConfig,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(cosine similarity of hidden states, future-path distance in m) of same-task pairs."""
    hidden = samples["hidden"]
    unit = hidden / np.maximum(np.linalg.norm(hidden, axis=1, keepdims=True), 1e-12)
    tasks = samples["task"]
    i, j = np.triu_indices(len(hidden), k=1)
    same = tasks[i] == tasks[j]
    i, j = i[same], j[same]
    if len(i) > config.max_pairs:
        pick = np.random.default_rng(seed).choice(len(i), config.max_pairs, replace=False)
        i, j = i[pick], j[pick]
    sims = np.einsum("nd,nd->n", unit[i], unit[j])
    dists = np.linalg.norm(samples["future"][i] - samples["future"][j], axis=1)
    return sims, dists


def calibrate(samples: dict, config: CalibrationConfig | None = None,
              model_fingerprint: str = "") -> VerifySkipCalibration:
    """Thresholds from :func:`collect_samples` output (see the module docstring)."""
    cfg = config or CalibrationConfig()
    has = np.isfinite(samples["score"])
    score, passed = samples["score"][has], samples["passed"][has]
    skip_t, skip_p, support = precision_threshold(score, passed, cfg.precision, cfg.min_support)
    sims, dists = hidden_pairs(samples, cfg)
    hidden_t, _, _ = precision_threshold(sims, dists <= cfg.trajectory_tolerance_m,
                                         cfg.precision, cfg.min_support)
    router_t = youden_threshold(samples["fused"][has], passed)
    notes = []
    if not support:
        note = (f"no similarity reached precision {cfg.precision} with {cfg.min_support} steps: "
                f"skip only identical observations")
        reached, at, at_support = best_precision(score, passed, cfg.min_support)
        if at_support:
            note += (f" (the most precise threshold, similarity >= {at:.4f}, had precision "
                     f"{reached:.2f} over {at_support} steps; {float(np.mean(passed)):.2f} of "
                     f"all held-out drafts pass)")
        notes.append(note)
    return VerifySkipCalibration(
        skip_threshold=skip_t, router_threshold=min(1.0, max(0.0, router_t)),
        precision_target=cfg.precision,
        skip_precision=skip_p if math.isfinite(skip_p) else float("nan"),
        skip_support=support, skip_rate=support / max(1, int(has.sum())),
        hidden_similarity_threshold=hidden_t, n_held_out_steps=len(samples["score"]),
        n_pairs=len(sims), model_fingerprint=model_fingerprint, notes="; ".join(notes))
