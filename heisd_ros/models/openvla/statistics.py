"""Action un-normalisation statistics from a checkpoint's ``dataset_statistics.json``.

The file maps dataset names to ``{"action": {"q01", "q99", "mask", ...}, ...}``; OpenVLA
un-normalises ``0.5 * (a + 1) * (q99 - q01) + q01`` where ``mask`` is true and passes the
rest (the gripper) through. Fine-tuning writes this file next to the weights; the pre-training
statistics inside ``config.json`` (``norm_stats``) are deliberately not used as a fallback,
because for a fine-tuned model they are the wrong ones.

Gripper convention, from OpenVLA's own code (github.com/openvla/openvla):

- ``prismatic/vla/datasets/rlds/oxe/transforms.py`` brings every dataset's gripper action to
  [0, 1] with 1 = open, 0 = closed (e.g. LIBERO's -1 = open / +1 = close is clipped and
  inverted); ``mask`` leaves it un-normalised, so the model predicts that value directly
  (``predict_action`` returns the bin centre for the gripper).
- ``experiments/robot/robot_utils.py``: ``normalize_gripper_action(binarize=True)`` maps
  [0, 1] to [-1, +1] and takes the sign, i.e. open exactly when the value is above 0.5
  (+1 = open); ``invert_gripper_action`` flips the sign for environments where -1 = open
  (LIBERO). Which of these a robot needs is the robot's convention, not the model's.

Here: :class:`OpenVLACodec` binarises the model's value at 0.5 (``ActionStats.
gripper_threshold``, the same decision as the sign above) and turns 1 = open into this
project's 0 = open / 1 = closed, so bins stay the model's own. The policy node sends
``EECommand.GRIPPER_CLOSED`` for 1 and ``GRIPPER_OPEN`` for 0; the PIPER driver commands
``gripper.open_width_m`` (0.07 m, the PIPER gripper's full opening) or
``gripper.closed_width_m`` (0 m, with ``gripper_effort_nm``), and only for a gripper token
the target produced itself. A checkpoint fine-tuned on 1 = closed data (not through
OpenVLA's transforms) needs ``gripper_open_is_one=False``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.actions.normalization import ActionCodec, ActionStats
from heisd_ros.data.observation import check_action

STATS_FILE = "dataset_statistics.json"
NO_NOOPS_SUFFIX = "_no_noops"   # OpenVLA's LIBERO fine-tunes: "libero_spatial_no_noops"


def choose_key(available: list[str], unnorm_key: str | None, path: Path) -> str:
    """OpenVLA's key rule: the only key when none is given; ``key`` or ``key_no_noops``."""
    if unnorm_key is None:
        if len(available) != 1:
            raise ValueError(f"{path}: holds statistics of {len(available)} datasets; choose one "
                             f"with unnorm_key from {sorted(available)}")
        return available[0]
    for candidate in (unnorm_key, unnorm_key + NO_NOOPS_SUFFIX):
        if candidate in available:
            return candidate
    raise ValueError(f"unnorm_key: {unnorm_key!r} is not in {path}; available: {sorted(available)}")


def load_action_stats(directory: Path, unnorm_key: str | None) -> tuple[str, ActionStats]:
    """(dataset key used, its action statistics) of a checkpoint directory."""
    path = Path(directory) / STATS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; OpenVLA needs the dataset statistics of its "
                                "(fine-tuning) data to un-normalise actions (fine-tuning writes "
                                "this file next to the weights)")
    try:
        stats = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(stats, dict) or not stats:
        raise ValueError(f"{path}: expected an object of dataset statistics, got {stats!r:.80}")
    key = choose_key(list(stats), unnorm_key, path)
    action = (stats[key] or {}).get("action") if isinstance(stats[key], dict) else None
    if not isinstance(action, dict) or "q01" not in action or "q99" not in action:
        raise ValueError(f"{path}: '{key}' has no action q01/q99 statistics")
    mask = action.get("mask", [True] * len(action["q01"]))
    try:
        return key, ActionStats(q01=action["q01"], q99=action["q99"], mask=mask)
    except ValueError as err:
        raise ValueError(f"{path}: statistics '{key}': {err}") from err


@dataclass(frozen=True)
class OpenVLACodec(ActionCodec):
    """Bins <-> physical actions for an OpenVLA checkpoint.

    Attributes:
        gripper_open_is_one: the model's gripper value means 1 = open (Open-X convention,
            OpenVLA's default); it is flipped to this project's 1 = closed on decode and back
            on encode.
    """

    gripper_open_is_one: bool = True

    def encode(self, action: np.ndarray) -> np.ndarray:
        """Physical action (7,), gripper 0 = open / 1 = closed -> bins (7,)."""
        a = check_action(action).copy()
        if self.gripper_open_is_one:
            a[-1] = 1.0 - a[-1]
        return super().encode(a)

    def decode(self, bins: np.ndarray) -> np.ndarray:
        """Bins (7,) -> physical action (7,), gripper 0 = open / 1 = closed."""
        a = super().decode(bins)
        if self.gripper_open_is_one:
            a[-1] = 1.0 - a[-1]
        return a
