"""Retrieval embeddings, the model fingerprint, and building a DB from demonstrations.

Embedding (docs/METHOD.md, "Draft sources"): the target VLA's pooled vision features of both
cameras, (n_cameras, D) -> concatenated (n_cameras * D,) -> L2-normalised float32. The
serving path only needs :func:`embedding_from_features` (numpy); everything that runs the
model (:func:`embed_observation`, :func:`model_fingerprint`, :func:`build_database`) imports
torch lazily through the target it is given.

The fingerprint identifies the weights and config the embeddings came from; a DB is refused
when it differs (``open_store(..., model_fingerprint=...)``). The config is hashed through its
``identity_json`` where it has one: fields that leave the network unchanged are left out, so
adding an optional feature does not orphan existing DBs. Tensors up to ``_FULL_HASH_ELEMENTS``
elements are hashed whole, larger ones by a fixed strided sample (a 7B model is then
fingerprinted in well under a second at startup, and any re-training still changes the sampled
values).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.retrieval.records import LOOKAHEAD, records_from_episode

#: Embedding variants by name (``--encoder``); only the VLA's own pooled features so far.
ENCODERS: tuple[str, ...] = ("vla_pooled",)
_FULL_HASH_ELEMENTS = 1 << 20
_SAMPLE_ELEMENTS = 1 << 16
#: DB point id = episode index * this + step (steps per demonstration stay far below it).
ID_STRIDE = 100_000


def embedding_from_features(features) -> np.ndarray:
    """(n_cameras, D) pooled features (array or tensor) -> (n_cameras * D,) unit float32."""
    if hasattr(features, "detach"):
        features = features.detach().float().cpu().numpy()
    vec = np.asarray(features, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(vec))
    if vec.size == 0 or not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"features: expected finite, non-zero values, got shape {vec.shape}")
    return (vec / norm).astype(np.float32)


def embedding_dimension(target, observation) -> int:
    """Dimension of the target's embedding (one encode of ``observation``)."""
    return int(embed_observation(target, observation).shape[0])


def embed_observation(target, observation, encoder: str = "vla_pooled") -> np.ndarray:
    """The DB embedding of one observation under ``encoder``."""
    if encoder not in ENCODERS:
        raise ValueError(f"encoder: unknown encoder {encoder!r}; valid: {list(ENCODERS)}")
    return embedding_from_features(target.encode(observation).vision_features)


def model_fingerprint(target, encoder: str = "vla_pooled") -> str:
    """``<class>:<encoder>:<16 hex>`` over the target's config and weights (see module doc)."""
    if encoder not in ENCODERS:
        raise ValueError(f"encoder: unknown encoder {encoder!r}; valid: {list(ENCODERS)}")
    digest = hashlib.sha256()
    config = getattr(target, "config", None)
    identity = getattr(config, "identity_json", None) or getattr(config, "to_json", None)
    if identity is not None:
        digest.update(identity().encode("utf-8"))
    modules = [getattr(target, "net", None) or target.language_model]
    for module in modules:
        for name, tensor in sorted(module.state_dict().items()):
            flat = tensor.detach().float().cpu().reshape(-1)
            if flat.numel() > _FULL_HASH_ELEMENTS:
                step = flat.numel() // _SAMPLE_ELEMENTS
                flat = flat[::step][:_SAMPLE_ELEMENTS]
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(flat.numpy().astype(np.float32).tobytes())
    return f"{type(target).__name__}:{encoder}:{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class BuildSummary:
    """What :func:`build_database` stored."""

    points: int
    episodes: int
    tasks: tuple[str, ...]
    dimension: int
    #: task name -> the suites whose episodes landed in its collection, where more than one did
    #: (two suites' tasks of one name share a collection, so retrieval mixes their scenes).
    shared: dict = field(default_factory=dict)


def build_database(target, episodes: Sequence, store, codec, *, lookahead: int = LOOKAHEAD,
                   encoder: str = "vla_pooled",
                   progress: Callable[[int], None] | None = None,
                   id_of: Callable[[int, int], int] | None = None) -> BuildSummary:
    """Embed every step of ``episodes`` (EpisodeRecords) into ``store``, one collection per task.

    Args:
        target: the VLA whose vision features embed the observations.
        episodes: (index, EpisodeRecord) pairs; the index makes the point ids stable.
        store: an open VectorStore (created with this target's dimension and fingerprint).
        codec: ActionCodec giving the payload bins of the demonstrated actions.
        lookahead: following actions stored with each step.
        encoder: embedding variant (``ENCODERS``).
        progress: called with the number of steps done after each episode.
        id_of: (episode index, step) -> point id; default ``index * ID_STRIDE + step``.
    """
    id_of = id_of or (lambda index, step: index * ID_STRIDE + step)
    points, suites_of = 0, {}
    for index, record in episodes:
        vectors = np.stack([embed_observation(target, record.observation(t), encoder)
                            for t in range(record.num_steps)])
        actions = np.asarray(record.action, dtype=np.float64)
        bins = np.stack([codec.encode(a) for a in actions])
        records = records_from_episode(record.task, index, bins, actions,
                                       np.asarray(record.ee_position_m, np.float64), lookahead)
        store.create_collection(record.task)
        store.upsert(record.task, [id_of(index, t) for t in range(len(records))], vectors,
                     [r.to_payload() for r in records])
        points += len(records)
        suites_of.setdefault(record.task, set()).add(record.suite)
        if progress is not None:
            progress(len(records))
    store.finalize()
    shared = {task: tuple(sorted(suites)) for task, suites in suites_of.items() if len(suites) > 1}
    return BuildSummary(points, len(episodes), tuple(sorted(suites_of)), store.dimension, shared)


def write_offline_stats(path: str | Path, stats: dict) -> Path:
    """Write the offline statistics next to the DB (router stats per suite, held-out demos)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return path


def split_held_out(paths: Iterable[Path], every: int,
                   task_of: Callable[[Path], str] | None = None) -> tuple[list[Path], list[Path]]:
    """(DB episodes, held-out episodes): every ``every``-th episode of each task is held out.

    ``every`` = 0 holds nothing out. Task = ``task_of(path)``, by default the episode file's
    parent directory (the npz layout).
    """
    db, held = [], []
    seen: dict[str, int] = {}
    for path in paths:
        task = task_of(Path(path)) if task_of is not None else Path(path).parent.name
        n = seen.get(task, 0)
        seen[task] = n + 1
        (held if every and n % every == every - 1 else db).append(Path(path))
    return db, held
