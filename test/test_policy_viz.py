"""The policy node's rviz markers: the executed path as a strip coloured by router mode.

Pure tests of the marker builders, and of :class:`PolicyOutputs` over a recording stand-in
for the node (no DDS): the strip rides in /heisd/router_markers, bounded and per episode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from test.ros_env import require_ros

require_ros()

from builtin_interfaces.msg import Time  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

from heisd_ros.decoding.interface import ROUTER_DRAFTER, ROUTER_OFF, ROUTER_RETRIEVAL  # noqa: E402
from heisd_ros.nodes.policy_config import PolicyNodeConfig  # noqa: E402
from heisd_ros.nodes.policy_decoders import DecodedStep  # noqa: E402
from heisd_ros.nodes.policy_inputs import RobotInput  # noqa: E402
from heisd_ros.nodes.policy_outputs import PolicyOutputs  # noqa: E402
from heisd_ros.nodes.policy_viz import (  # noqa: E402
    NAMESPACE,
    PATH_MARKER_ID,
    PATH_NAMESPACE,
    ROUTER_COLOURS,
    SOURCE_COLOURS,
    RouterPath,
    router_path_marker,
    step_markers,
)
from heisd_ros.robot.base import CommandSource  # noqa: E402

STAMP = Time(sec=12, nanosec=500)


def _points(marker) -> np.ndarray:
    return np.array([(p.x, p.y, p.z) for p in marker.points])


def _colours(marker) -> np.ndarray:
    return np.array([(c.r, c.g, c.b) for c in marker.colors])


def _close(actual: np.ndarray, expected) -> bool:
    """Same shape and values (ColorRGBA holds float32)."""
    expected = np.asarray(expected, float)
    return actual.shape == expected.shape and np.allclose(actual, expected, atol=1e-6)


def test_the_strip_follows_the_positions_and_colours_each_point_by_its_router_mode():
    positions = [(0.3, 0.0, 0.25), (0.31, 0.01, 0.24), (0.32, 0.02, 0.23)]
    modes = [ROUTER_DRAFTER, ROUTER_RETRIEVAL, ROUTER_OFF]
    strip = router_path_marker(STAMP, "base_link", np.array(positions), modes)
    assert strip.type == Marker.LINE_STRIP and strip.action == Marker.ADD
    assert (strip.ns, strip.id) == (PATH_NAMESPACE, PATH_MARKER_ID)
    assert strip.header.frame_id == "base_link" and strip.header.stamp == STAMP
    assert _close(_points(strip), positions)
    assert _close(_colours(strip), [ROUTER_COLOURS[m] for m in modes])
    assert all(c.a > 0 for c in strip.colors) and strip.scale.x > 0
    assert strip.pose.orientation.w == 1.0


def test_router_colours_are_those_of_the_sources_they_route_to():
    assert ROUTER_COLOURS[ROUTER_DRAFTER] == SOURCE_COLOURS[CommandSource.DRAFTER]
    assert ROUTER_COLOURS[ROUTER_RETRIEVAL] == SOURCE_COLOURS[CommandSource.RETRIEVAL]
    assert ROUTER_COLOURS[ROUTER_OFF] == SOURCE_COLOURS[CommandSource.AR]
    assert len(set(ROUTER_COLOURS.values())) == 3


def test_one_position_is_a_zero_length_strip_of_two_points():
    strip = router_path_marker(STAMP, "base_link", [(0.3, 0.0, 0.25)], [ROUTER_RETRIEVAL])
    assert _close(_points(strip), [(0.3, 0.0, 0.25)] * 2)
    assert _close(_colours(strip), [ROUTER_COLOURS[ROUTER_RETRIEVAL]] * 2)


def test_an_unknown_router_mode_is_white_and_mismatched_inputs_are_refused():
    strip = router_path_marker(STAMP, "f", [(0, 0, 0), (1, 0, 0)], [ROUTER_OFF, 9])
    assert _close(_colours(strip)[1], (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="one router mode per position"):
        router_path_marker(STAMP, "f", [(0, 0, 0), (1, 0, 0)], [ROUTER_OFF])
    with pytest.raises(ValueError, match="at least one position"):
        router_path_marker(STAMP, "f", [], [])
    with pytest.raises(ValueError, match="max_points"):
        RouterPath(0)


def test_the_router_path_keeps_the_newest_points_under_one_fixed_id():
    path = RouterPath(max_points=3)
    strips = [path.add((0.1 * i, 0.0, 0.2), i % 3, STAMP, "base_link") for i in range(5)]
    assert [len(s.points) for s in strips] == [2, 2, 3, 3, 3]
    assert {(s.ns, s.id) for s in strips} == {(PATH_NAMESPACE, PATH_MARKER_ID)}
    assert len(path) == 3
    assert _close(_points(strips[-1])[:, 0], [0.2, 0.3, 0.4])
    assert _close(_colours(strips[-1]), [ROUTER_COLOURS[m] for m in (2, 0, 1)])


class _Recorder:
    """A publisher that keeps what it was given."""

    def __init__(self, topic: str) -> None:
        self.topic, self.sent = topic, []

    def publish(self, msg) -> None:
        self.sent.append(msg)


class _Node:
    """Stands in for the policy node: publishers that record, by topic."""

    def __init__(self) -> None:
        self.pubs: dict[str, _Recorder] = {}

    def get_clock(self):
        return None

    def create_publisher(self, _msg_type, topic: str, _depth: int) -> _Recorder:
        return self.pubs.setdefault(topic, _Recorder(topic))


def _step(outputs: PolicyOutputs, index: int, x_m: float, router_mode: int) -> None:
    step = DecodedStep(action=np.zeros(7), bins=np.zeros(7, np.int64),
                       source=CommandSource.RETRIEVAL, gripper_from_target=True,
                       fields={"router_mode": router_mode, "fused_metric": 0.5})
    robot = RobotInput(stamp_s=1.0, joint_positions_rad=np.zeros(6), gripper_width_m=0.07,
                       ee_position_m=np.array([x_m, 0.0, 0.25]), ee_rpy_rad=np.zeros(3))
    outputs.step_viz(step, index, STAMP, robot, "task", None)


def _strip(markers):
    return next(m for m in markers.markers if m.ns == PATH_NAMESPACE)


def test_the_outputs_publish_the_strip_with_the_step_markers_bounded_and_per_episode():
    node = _Node()
    outputs = PolicyOutputs(node, PolicyNodeConfig(path_length=3, marker_keep=2))
    sent = node.pubs["/heisd/router_markers"].sent
    modes = [ROUTER_DRAFTER, ROUTER_RETRIEVAL, ROUTER_RETRIEVAL, ROUTER_DRAFTER]
    for i, mode in enumerate(modes):
        _step(outputs, i, 0.3 + 0.01 * i, mode)
    assert len(sent) == 4
    assert [len(_strip(m).points) for m in sent] == [2, 2, 3, 3]
    assert all(m.ns in (NAMESPACE, PATH_NAMESPACE) for a in sent for m in a.markers)
    last = _strip(sent[-1])
    assert _close(_points(last)[:, 0], [0.31, 0.32, 0.33])
    assert _close(_colours(last), [ROUTER_COLOURS[m] for m in modes[1:]])
    # the strip and the nav_msgs/Path hold the same episode
    assert len(node.pubs["/heisd/ee_path"].sent[-1].poses) == len(last.points)
    outputs.new_episode()
    _step(outputs, 4, 0.5, ROUTER_OFF)
    first = _strip(sent[-1])
    assert _close(_points(first), [(0.5, 0.0, 0.25)] * 2)
    assert _close(_colours(first), [ROUTER_COLOURS[ROUTER_OFF]] * 2)
    assert (first.ns, first.id) == (PATH_NAMESPACE, PATH_MARKER_ID)


def test_step_markers_are_unchanged_by_the_strip():
    markers = step_markers(3, STAMP, "base_link", (0.3, 0.0, 0.25), CommandSource.DRAFTER,
                           {"router_mode": ROUTER_RETRIEVAL, "fused_metric": 0.25}, keep=2)
    assert [(m.ns, m.id, m.type) for m in markers.markers] == [
        (NAMESPACE, 2, Marker.SPHERE), (NAMESPACE, 3, Marker.TEXT_VIEW_FACING)]
    assert "router retrieval" in markers.markers[1].text


def test_the_rviz_config_shows_the_strip_namespace():
    rviz = yaml.safe_load((Path(__file__).resolve().parent.parent / "config" / "heisd.rviz")
                          .read_text())
    display = next(d for d in rviz["Visualization Manager"]["Displays"]
                   if d["Class"] == "rviz_default_plugins/MarkerArray")
    assert display["Topic"]["Value"] == "/heisd/router_markers"
    assert display["Namespaces"] == {NAMESPACE: True, PATH_NAMESPACE: True}
