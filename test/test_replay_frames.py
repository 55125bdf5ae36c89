"""Frame pairing of heisd-replay on a bag laid out like a real robot's recording.

Cameras with slightly different stamps, a dropped wrist frame, joint states at 200 Hz.
"""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.data.rosbag_io import make_typestore
from heisd_ros.eval.bag_frames import BagTopics, inspect_bag, iter_frames


def _write(path, ts, events):
    from rosbags.rosbag2 import Writer

    types = ts.types
    with Writer(path, version=9) as writer:
        conns = {}
        for topic, msgtype, _, _ in events:
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=ts)
        for topic, msgtype, t_s, value in sorted(events, key=lambda e: e[2]):
            ns = int(round(t_s * 1e9))
            header = types["std_msgs/msg/Header"](
                stamp=types["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                frame_id="f")
            if msgtype.endswith("Image"):
                msg = types[msgtype](header=header, height=16, width=16, encoding="bgr8",
                                     is_bigendian=0, step=48,
                                     data=np.full(16 * 48, value, dtype=np.uint8))
            else:
                msg = types[msgtype](header=header, name=["joint1", "gripper"],
                                     position=np.array([value, 0.03]), velocity=np.zeros(0),
                                     effort=np.zeros(0))
            writer.write(conns[topic], ns, ts.serialize_cdr(msg, msgtype))


def test_pairing_with_skew_and_a_dropped_wrist_frame(tmp_path):
    ts = make_typestore()
    img, js = "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState"
    events = [("/cam", img, t, 10 + k) for k, t in enumerate((0.0, 0.1, 0.2))]
    events += [("/wrist", img, t, 50) for t in (0.012, 0.213)]       # none near 0.1
    events += [("/js", js, 0.005 * k, float(k)) for k in range(50)]  # 200 Hz
    _write(tmp_path / "bag", ts, events)
    topics = BagTopics(primary="/cam", wrist="/wrist", joint_states="/js", ee_pose="")
    info = inspect_bag(tmp_path / "bag", topics)
    frames = list(iter_frames(info, topics, "do it", max_skew_s=0.02))
    assert [f.stamp_s for f in frames] == pytest.approx([0.0, 0.2])
    assert [int(f.image_primary[0, 0, 0]) for f in frames] == [10, 12]
    assert frames[1].extras["skipped_frames"] == 1
    assert frames[0].proprio is None  # no EE pose topic: no proprio
    # The joint state is the latest logged at (or before) the frame's pairing time.
    assert frames[1].extras["joint_positions_rad"][0] == pytest.approx(42.0)
    assert len(list(iter_frames(info, topics, "do it", max_frames=1, max_skew_s=0.02))) == 1
