"""rviz messages of the policy node: the executed EE path and per-step router markers.

The marker of a step is a sphere at the EE position, coloured by what produced the action:
grey AR, blue drafter, green retrieval (verified), orange retrieval verify-skipped; a text
marker above it shows the router mode, the fused metric F and the accepted length.
"""

from __future__ import annotations

import math

from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Path
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from heisd_ros.robot.base import CommandSource

SOURCE_COLOURS = {
    CommandSource.AR: (0.6, 0.6, 0.6),
    CommandSource.DRAFTER: (0.2, 0.4, 1.0),
    CommandSource.RETRIEVAL: (0.1, 0.8, 0.2),
    CommandSource.RETRIEVAL_SKIP: (1.0, 0.55, 0.0),
}
ROUTER_NAMES = {0: "drafter", 1: "retrieval", 2: "off"}
NAMESPACE = "heisd_router"


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
    router = ROUTER_NAMES.get(int(fields.get("router_mode", 2)), "?")
    f_text = "F=n/a" if math.isnan(fused) else f"F={fused:.2f}"
    text.text = f"{source.name.lower()} | router {router} | {f_text} | AL={accepted:.2f}"
    return MarkerArray(markers=[sphere, text])
