"""rviz messages of the policy node: the executed EE path and per-step router markers.

The marker of a step is a sphere at the EE position, coloured by what produced the action:
grey AR, blue drafter, green retrieval (verified), orange retrieval verify-skipped; a text
marker above it shows the router mode, the fused metric F and the accepted length.

The episode's executed EE path is also drawn as one line strip (namespace
``heisd_router_path``, one fixed id, so each step replaces it) whose points are coloured by
the router's mode at that step: blue drafter, green retrieval, grey off (no router), the
colours of the matching command sources.
"""

from __future__ import annotations

import math
from collections import deque

from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, PoseStamped
from nav_msgs.msg import Path
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from heisd_ros.decoding.interface import (
    ROUTER_DRAFTER,
    ROUTER_MODE_NAMES,
    ROUTER_OFF,
    ROUTER_RETRIEVAL,
)
from heisd_ros.robot.base import CommandSource

SOURCE_COLOURS = {
    CommandSource.AR: (0.6, 0.6, 0.6),
    CommandSource.DRAFTER: (0.2, 0.4, 1.0),
    CommandSource.RETRIEVAL: (0.1, 0.8, 0.2),
    CommandSource.RETRIEVAL_SKIP: (1.0, 0.55, 0.0),
}
NAMESPACE = "heisd_router"
#: router_mode -> colour of the path strip; a mode shares the colour of the source it routes to.
ROUTER_COLOURS = {
    ROUTER_DRAFTER: SOURCE_COLOURS[CommandSource.DRAFTER],
    ROUTER_RETRIEVAL: SOURCE_COLOURS[CommandSource.RETRIEVAL],
    ROUTER_OFF: SOURCE_COLOURS[CommandSource.AR],
}
PATH_NAMESPACE = "heisd_router_path"
PATH_MARKER_ID = 0
PATH_WIDTH_M = 0.004


def append_pose(path: Path, pose: PoseStamped, max_poses: int) -> Path:
    """Add ``pose`` to the executed path (keeping the newest ``max_poses``); returns it."""
    path.header = pose.header
    path.poses.append(pose)
    if len(path.poses) > max_poses:
        del path.poses[: len(path.poses) - max_poses]
    return path


def step_markers(step_index: int, stamp: Time, frame_id: str, position_m, source: CommandSource,
                 fields: dict, keep: int) -> MarkerArray:
    """Sphere + text for one step; marker ids cycle over ``keep`` so old ones are replaced."""
    r, g, b = SOURCE_COLOURS.get(source, (1.0, 1.0, 1.0))
    x, y, z = (float(v) for v in position_m)
    sphere = Marker(ns=NAMESPACE, id=2 * (step_index % keep), type=Marker.SPHERE,
                    action=Marker.ADD)
    sphere.header.stamp, sphere.header.frame_id = stamp, frame_id
    sphere.pose.position.x, sphere.pose.position.y, sphere.pose.position.z = x, y, z
    sphere.pose.orientation.w = 1.0
    sphere.scale.x = sphere.scale.y = sphere.scale.z = 0.012
    sphere.color = ColorRGBA(r=r, g=g, b=b, a=0.9)
    fused = float(fields.get("fused_metric", math.nan))
    rounds = list(fields.get("accepted_length_per_round", []))
    accepted = sum(rounds) / len(rounds) if rounds else 1.0
    text = Marker(ns=NAMESPACE, id=sphere.id + 1, type=Marker.TEXT_VIEW_FACING,
                  action=Marker.ADD)
    text.header = sphere.header
    text.pose.position.x, text.pose.position.y, text.pose.position.z = x, y, z + 0.03
    text.pose.orientation.w = 1.0
    text.scale.z = 0.012
    text.color = ColorRGBA(r=r, g=g, b=b, a=1.0)
    router = ROUTER_MODE_NAMES.get(int(fields.get("router_mode", ROUTER_OFF)), "?")
    f_text = "F=n/a" if math.isnan(fused) else f"F={fused:.2f}"
    text.text = f"{source.name.lower()} | router {router} | {f_text} | AL={accepted:.2f}"
    return MarkerArray(markers=[sphere, text])


def router_path_marker(stamp: Time, frame_id: str, positions_m, router_modes) -> Marker:
    """LINE_STRIP through ``positions_m`` (N x 3, m), point i coloured by ``router_modes[i]``.

    A strip needs two points: a single position is drawn as a zero-length strip (the point
    twice), so the marker of a new episode's first step still replaces the last episode's.
    """
    positions, modes = list(positions_m), list(router_modes)
    if len(positions) != len(modes) or not positions:
        raise ValueError(f"router_path_marker needs one router mode per position and at least "
                         f"one position, got {len(positions)} positions, {len(modes)} modes")
    if len(positions) == 1:
        positions, modes = positions * 2, modes * 2
    strip = Marker(ns=PATH_NAMESPACE, id=PATH_MARKER_ID, type=Marker.LINE_STRIP,
                   action=Marker.ADD)
    strip.header.stamp, strip.header.frame_id = stamp, frame_id
    strip.pose.orientation.w = 1.0
    strip.scale.x = PATH_WIDTH_M  # line width
    strip.color = ColorRGBA(r=1.0, g=1.0, b=1.0, a=0.9)  # unused while colors is complete
    for position, mode in zip(positions, modes, strict=True):
        x, y, z = (float(v) for v in position)
        strip.points.append(Point(x=x, y=y, z=z))
        r, g, b = ROUTER_COLOURS.get(int(mode), (1.0, 1.0, 1.0))
        strip.colors.append(ColorRGBA(r=r, g=g, b=b, a=0.9))
    return strip


class RouterPath:
    """The executed EE positions of an episode and the router mode of each (newest kept)."""

    def __init__(self, max_points: int) -> None:
        """Keep at most ``max_points`` positions (the oldest go first)."""
        if max_points < 1:
            raise ValueError(f"RouterPath max_points must be >= 1, got {max_points}")
        self.positions_m: deque[tuple[float, float, float]] = deque(maxlen=max_points)
        self.router_modes: deque[int] = deque(maxlen=max_points)

    def __len__(self) -> int:
        """Positions held."""
        return len(self.positions_m)

    def add(self, position_m, router_mode: int, stamp: Time, frame_id: str) -> Marker:
        """Append one step's EE position (m) and router mode; return the updated strip."""
        x, y, z = (float(v) for v in position_m)
        self.positions_m.append((x, y, z))
        self.router_modes.append(int(router_mode))
        return router_path_marker(stamp, frame_id, self.positions_m, self.router_modes)
