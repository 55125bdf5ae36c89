"""Kinematic groups of the 7 action tokens (HeiSD's sequence-wise acceptance works on them)."""

from __future__ import annotations

from heisd_ros.data.observation import ACTION_DIM

#: Token positions of each kinematic group, in token order.
ACTION_GROUPS: dict[str, tuple[int, ...]] = {
    "position": (0, 1, 2),   # dx, dy, dz (m)
    "rotation": (3, 4, 5),   # droll, dpitch, dyaw (rad)
    "gripper": (6,),         # binary state
}

#: Token position of the gripper.
GRIPPER_DIM = 6


def group_of_dim(dim: int) -> str:
    """Name of the kinematic group holding action dimension ``dim`` (0..6)."""
    for name, dims in ACTION_GROUPS.items():
        if dim in dims:
            return name
    raise ValueError(f"dim: expected 0..{ACTION_DIM - 1}, got {dim}")


def group_spans() -> list[tuple[str, int, int]]:
    """(name, first dim, end dim exclusive) of each group, in token order."""
    return [(name, dims[0], dims[-1] + 1) for name, dims in ACTION_GROUPS.items()]
