"""rosbag2 export with rosbags: topics, types, counts, custom message, image round trip."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.data.rosbag_io import (
    EE_COMMAND_TYPE,
    TOPIC_EE_COMMAND,
    TOPIC_EE_POSE,
    TOPIC_JOINT_STATES,
    TOPIC_THIRD_PERSON,
    TOPIC_TYPES,
    TOPIC_WRIST,
    bag_topic_summary,
    image_from_msg,
    make_typestore,
    read_bag_messages,
    write_episode_bag,
)
from test.test_data_npz import synthetic_record

rosbags = pytest.importorskip("rosbags")


@pytest.fixture(scope="module")
def typestore():
    return make_typestore()


def test_eecommand_is_registered_from_the_msg_file(typestore):
    cls = typestore.types[EE_COMMAND_TYPE]
    assert cls.GRIPPER_CLOSED == 1 and cls.SOURCE_SCRIPTED == 4 and cls.MODE_DELTA == 0
    with pytest.raises(ValueError, match="EECommand.msg"):
        make_typestore("/nonexistent")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_round_trip(tmp_path, typestore, storage):
    record = synthetic_record(steps=4, size=24)
    record.action[1, 6] = 1.0
    path = write_episode_bag(record, tmp_path / "bag", storage=storage,
                             start_time_ns=1_700_000_000_000_000_000, typestore=typestore)
    suffix = ".mcap" if storage == "mcap" else ".db3"
    assert list(path.glob(f"*{suffix}"))
    summary = bag_topic_summary(path)
    assert summary == {topic: (msgtype, 4) for topic, msgtype in TOPIC_TYPES.items()}

    by_topic: dict[str, list] = {}
    for topic, stamp_ns, msg in read_bag_messages(path, typestore=typestore):
        by_topic.setdefault(topic, []).append((stamp_ns, msg))
    stamp, image = by_topic[TOPIC_WRIST][2]
    assert stamp == 1_700_000_000_000_000_000 + 200_000_000
    assert image.encoding == "rgb8" and image.step == 24 * 3
    assert np.array_equal(image_from_msg(image), record.image_wrist[2])
    assert np.array_equal(image_from_msg(by_topic[TOPIC_THIRD_PERSON][0][1]),
                          record.image_third_person[0])
    joints = by_topic[TOPIC_JOINT_STATES][1][1]
    assert list(joints.name)[-1] == "gripper"
    np.testing.assert_allclose(joints.position[:6], record.joint_positions_rad[1], rtol=1e-6)
    pose = by_topic[TOPIC_EE_POSE][3][1]
    assert pose.header.frame_id == "base_link"
    np.testing.assert_allclose([pose.pose.position.x, pose.pose.position.y, pose.pose.position.z],
                               record.ee_position_m[3], rtol=1e-6)
    command = by_topic[TOPIC_EE_COMMAND][1][1]
    assert command.step_index == 1 and command.gripper == 1 and command.mode == 0
    assert command.header.stamp.nanosec == 100_000_000
    np.testing.assert_allclose([command.translation_m.x, command.rotation_rad.z],
                               [record.action[1, 0], record.action[1, 5]], rtol=1e-6)


def test_image_from_msg_honours_padding_and_bgr(typestore):
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    padded = np.zeros((2, 12), np.uint8)
    padded[:, :9] = image.reshape(2, 9)
    msg_type = typestore.types["sensor_msgs/msg/Image"]
    header = typestore.types["std_msgs/msg/Header"](
        stamp=typestore.types["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id="")
    msg = msg_type(header=header, height=2, width=3, encoding="bgr8", is_bigendian=0, step=12,
                   data=padded.reshape(-1))
    assert np.array_equal(image_from_msg(msg), image[..., ::-1])


def test_existing_bag_is_not_overwritten(tmp_path, typestore):
    record = synthetic_record(steps=1)
    write_episode_bag(record, tmp_path / "bag", typestore=typestore)
    with pytest.raises(Exception, match="exists"):
        write_episode_bag(record, tmp_path / "bag", typestore=typestore)
    with pytest.raises(ValueError, match="storage"):
        write_episode_bag(record, tmp_path / "bag2", storage="rosbag1", typestore=typestore)
