"""Which draft head a tool or the node uses: the given one, the shipped one, or (loudly) none.

The rule, the same for the policy node, heisd-eval, heisd-replay, heisd-record and heisd-bench:

1. an explicit head (``--drafter``, ``model.drafter_path``) is loaded; one whose card names
   another target (neither its sha256 nor its model fingerprint matches) is refused;
2. else the shipped head (``heisd_ros/assets/draft_head.safetensors``) when the target is the
   VLA it was trained for (the shipped small VLA: the same file by sha256, or the same
   weights by model fingerprint, so a metadata-only change such as the gripper rule keeps it),
   or a shipped specialist's head (``draft_head_dynamic.safetensors``) when the target is
   that specialist (the same rule);
3. else a seeded untrained head (exact, but AL ~1 and slower than AR): ``warn`` gets a line
   saying so and :attr:`HeadChoice.untrained` is True, for the caller's report.

Messages name a head's target as the user knows it (:func:`head_target_text`): the shipped
small VLA, or the target's file name, with the sha256 prefix. Never the path in the head's
card: cards written before heisd-train-drafter recorded only a file name hold the path of the
training run (the shipped head's says ``runs/s15/...``), which the user cannot act on.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heisd_ros.models.loading import DEFAULT_TARGET_PATH, file_digest

#: The draft head shipped with the small VLA (trained for ``DEFAULT_TARGET_PATH``).
SHIPPED_DRAFT_HEAD = DEFAULT_TARGET_PATH.with_name("draft_head.safetensors")
#: Heads shipped for the other shipped small VLAs (``draft_head_dynamic`` for
#: ``small_vla_dynamic``): chosen, by the same rule, for the target their cards name.
SHIPPED_OTHER_HEADS = (DEFAULT_TARGET_PATH.with_name("draft_head_dynamic.safetensors"),)
#: How messages name the shipped small VLA (a path inside the installed package).
SHIPPED_TARGET_NAME = f"heisd_ros/assets/{DEFAULT_TARGET_PATH.name}"
#: How heisd-train-drafter's card names its target: ``"<file name> (sha256 <16 hex>)"``
#: (older cards: a path in place of the file name, and text after it).
_CARD_SHA = re.compile(r"\(sha256 ([0-9a-f]{8,64})\)")


@dataclass(frozen=True)
class HeadChoice:
    """The chosen head, what it is, and whether it is untrained (no speed-up)."""

    head: Any
    description: str
    untrained: bool = False


def target_file(path: str | None) -> Path | None:
    """The small-VLA file ``load_target(path)`` loads (None: a random initialisation)."""
    if path:
        return Path(path)
    return DEFAULT_TARGET_PATH if DEFAULT_TARGET_PATH.is_file() else None


def _card(path) -> dict:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            card = json.loads((handle.metadata() or {}).get("card", "{}"))
    except (OSError, ValueError, SafetensorError):
        return {}
    return card if isinstance(card, dict) else {}


def card_target(target_file: Path | None, description: str) -> str:
    """What heisd-train-drafter records as a head's target: ``"<file name> (sha256 <16 hex>)"``.

    ``target_file`` is the small-VLA file the target came from; without one (a random
    initialisation, OpenVLA) the target's ``description``, which names no sha256, so a head
    trained for it is not checked against a target. The file name, not its path: a path would
    be the training machine's (e.g. a run folder) and mean nothing where the head is used.
    """
    if target_file is None:
        return description
    return f"{Path(target_file).name} (sha256 {file_digest(target_file)})"


def draft_head_target(path) -> tuple[str | None, str]:
    """(sha256 prefix, the card's text) of the target a draft head was trained for.

    heisd-train-drafter records its target in the head's ``card`` metadata as
    ``"<file name> (sha256 <16 hex>)"`` (:func:`card_target`); (None, "") when the head does
    not say. The text is the card's, for records only: messages use :func:`head_target_text`.
    """
    text = str(_card(path).get("target", ""))
    match = _CARD_SHA.search(text)
    return (match.group(1) if match else None), text


def _is_shipped_target(head_path, recorded_sha: str | None) -> bool:
    """Whether the head at ``head_path`` was trained for the shipped small VLA.

    The shipped head is; another head is when its card names the shipped file's sha256 or the
    weights the shipped head's card names (a metadata-only change of the shipped file).
    """
    if Path(head_path).resolve() == SHIPPED_DRAFT_HEAD.resolve():
        return True
    if (recorded_sha is not None and DEFAULT_TARGET_PATH.is_file()
            and _same_sha(recorded_sha, file_digest(DEFAULT_TARGET_PATH))):
        return True
    fingerprint = draft_head_fingerprint(head_path)
    return (fingerprint is not None and SHIPPED_DRAFT_HEAD.is_file()
            and fingerprint == draft_head_fingerprint(SHIPPED_DRAFT_HEAD))


def head_target_text(head_path) -> str:
    """The target a draft head was trained for, named for a user's message.

    ``"the shipped small VLA (heisd_ros/assets/small_vla.safetensors, sha256 <hex>)"``, else
    the file name the card records with its sha256 prefix (``"vla.safetensors (sha256
    <hex>)"``), else ``"a target with sha256 <hex>"``. Never the card's path (module
    docstring).
    """
    recorded, text = draft_head_target(head_path)
    sha = f"sha256 {recorded}" if recorded else ""
    if _is_shipped_target(head_path, recorded):
        return f"the shipped small VLA ({', '.join(filter(None, (SHIPPED_TARGET_NAME, sha)))})"
    match = _CARD_SHA.search(text)
    name = Path(text[:match.start()].strip()).name if match else ""
    if name and sha:
        return f"{name} ({sha})"
    return f"a target with {sha}" if sha else "a target the head's card does not name"


def draft_head_fingerprint(path) -> str | None:
    """The model fingerprint of the target a draft head was trained for (None: not recorded).

    heisd-train-drafter records it as the card's ``target_fingerprint``; it names the target's
    config and weights, so it survives a metadata-only change of the target file.
    """
    value = _card(path).get("target_fingerprint")
    return str(value) if value else None


def _same_sha(a: str, b: str) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _trained_for(head_path, recorded_sha: str | None, sha: str | None,
                 target_fingerprint: Callable[[], str]) -> bool:
    """Whether the head at ``head_path`` was trained for the target (file sha or weights).

    ``target_fingerprint()`` gives the target's model fingerprint; it hashes the weights, so
    callers pass one cached function for all the heads they try.
    """
    if sha is not None and recorded_sha is not None and _same_sha(recorded_sha, sha):
        return True
    fingerprint = draft_head_fingerprint(head_path)
    return fingerprint is not None and fingerprint == target_fingerprint()


def choose_draft_head(target, target_path: Path | None, drafter_path: str | None, seed: int,
                      warn: Callable[[str], None], option: str = "--drafter",
                      target_option: str = "--target") -> HeadChoice:
    """The draft head for ``target`` loaded from ``target_path`` (module docstring's rule).

    Args:
        target: the loaded target VLA.
        target_path: the file it came from (None: a random initialisation or OpenVLA).
        drafter_path: an explicit head, or None/"" for the default.
        seed: seed of an untrained head.
        warn: gets the warning when the head is untrained.
        option: the name of the head option (``--drafter``), for messages.
        target_option: the name of the target option (``--target``), for messages.

    Raises:
        ValueError: ``drafter_path`` names a head trained for another target, or one that
            does not fit the target. FileNotFoundError: ``drafter_path`` does not exist.
    """
    from heisd_ros.models.checkpoint import load_draft_head

    file = target_path
    sha = file_digest(file) if file is not None and file.is_file() else None

    @functools.cache
    def target_fingerprint() -> str:
        from heisd_ros.retrieval.embedding import model_fingerprint

        return model_fingerprint(target)

    if sha:
        loaded = f"{file} (sha256 {sha})"
    elif getattr(target, "checkpoint", None) is not None:    # OpenVLA: a directory
        loaded = f"the OpenVLA checkpoint {target.checkpoint}"
    else:
        loaded = f"a random-init or non-file target (seed={seed})"
    if drafter_path:
        head = load_draft_head(drafter_path, target)
        recorded = draft_head_target(drafter_path)[0]
        if recorded is None:
            return HeadChoice(head, f"draft head {drafter_path} (target not recorded, "
                                    f"not checked)")
        if not _trained_for(drafter_path, recorded, sha, target_fingerprint):
            raise ValueError(f"{option}: {drafter_path} was trained for the target "
                             f"{head_target_text(drafter_path)}, but the loaded target is "
                             f"{loaded}; use a draft head trained for this target "
                             f"(heisd-train-drafter --target ...) or set {target_option} to the "
                             f"target it was trained for")
        return HeadChoice(head, f"draft head {drafter_path} (trained for this target)")
    for shipped in (SHIPPED_DRAFT_HEAD, *SHIPPED_OTHER_HEADS):
        if not shipped.is_file():
            continue
        recorded = draft_head_target(shipped)[0]
        if _trained_for(shipped, recorded, sha, target_fingerprint) or (
                shipped == SHIPPED_DRAFT_HEAD and recorded is None
                and file == DEFAULT_TARGET_PATH):
            return HeadChoice(load_draft_head(shipped, target), f"shipped draft head {shipped}")
    if SHIPPED_DRAFT_HEAD.is_file():
        reason = (f"the shipped draft head is for {head_target_text(SHIPPED_DRAFT_HEAD)}, the "
                  f"target is {loaded}")
    else:
        reason = f"no shipped draft head at {SHIPPED_DRAFT_HEAD}"
    import torch

    from heisd_ros.models.draft_head import DraftHead, DraftHeadConfig

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = DraftHead(DraftHeadConfig.for_target(target))
    description = (f"untrained draft head (seed={seed}): exact but no speed-up ({reason}); "
                   f"set {option} to one from heisd-train-drafter")
    warn(description)
    dtype = getattr(getattr(target, "language_model", None), "dtype", None)
    head = head.to(dtype=dtype) if dtype is not None else head
    return HeadChoice(head.eval(), description, untrained=True)
