"""Frame pairing of heisd-replay on bags laid out like real robots' recordings.

Each bag is written here with the rosbags writer: cameras whose stamps are offset, jittered
or at different rates, joint states at 200 Hz, PoseStamped EE poses, and the faults a real
recording has (a dropped frame, NaN in the state, a JointState without a "gripper").
Each image's pixel value says which frame it is, so a test sees what was paired with what.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from heisd_ros.data.pairing import PairingReport, nearest, thin_to_rate
from heisd_ros.data.rosbag_io import make_typestore
from heisd_ros.eval.bag_frames import BagError, BagTopics, FrameOptions, inspect_bag, iter_frames

IMG, JS, POSE = "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState", \
    "geometry_msgs/msg/PoseStamped"
TOPICS = BagTopics(primary="/cam", wrist="/wrist", joint_states="/js", ee_pose="/pose")


def _write(path, events, names=("joint1", "joint2", "joint3", "joint4", "joint5", "joint6",
                                "gripper"), version=9):
    """events: (topic, type, header stamp s, value); logged in stamp order."""
    from rosbags.rosbag2 import Writer

    ts = make_typestore()
    types = ts.types
    with Writer(path, version=version) as writer:
        conns = {}
        for topic, msgtype, _, _ in events:
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=ts)
        for topic, msgtype, t_s, value in sorted(events, key=lambda e: e[2]):
            ns = int(round(t_s * 1e9))
            header = types["std_msgs/msg/Header"](
                stamp=types["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                frame_id="f")
            if msgtype == IMG:
                msg = types[msgtype](header=header, height=16, width=16, encoding="bgr8",
                                     is_bigendian=0, step=48,
                                     data=np.full(16 * 48, value, dtype=np.uint8))
            elif msgtype == JS:
                msg = types[msgtype](header=header, name=list(names),
                                     position=np.array([value] * 6 + [0.03])[:len(names)],
                                     velocity=np.zeros(0), effort=np.zeros(0))
            else:
                msg = types[msgtype](header=header, pose=types["geometry_msgs/msg/Pose"](
                    position=types["geometry_msgs/msg/Point"](x=value, y=0.0, z=0.3),
                    orientation=types["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0,
                                                                      w=1.0)))
            # logged 2 ms after the stamp: what a recorder on the robot sees
            writer.write(conns[topic], ns + 2_000_000, ts.serialize_cdr(msg, msgtype))
    return path


def _state(until_s, hz=200.0, value=lambda t: t):
    times = np.arange(0.0, until_s, 1 / hz)
    return ([("/js", JS, t, float(value(t))) for t in times]
            + [("/pose", POSE, t, float(value(t))) for t in times])


def _cameras(primary_hz, wrist_hz, n_primary, wrist_offset_s=0.0, jitter_s=0.0, seed=0):
    rng = np.random.default_rng(seed)
    events = [("/cam", IMG, k / primary_hz, k % 250) for k in range(n_primary)]
    n_wrist = int(np.ceil(n_primary * wrist_hz / primary_hz)) + 1
    events += [("/wrist", IMG, max(0.0, k / wrist_hz + wrist_offset_s
                                   + rng.uniform(-jitter_s, jitter_s)), k % 250)
               for k in range(n_wrist)]
    return events


def _frames(path, options=None, topics=TOPICS, **kwargs):
    options, report = options or FrameOptions(), PairingReport()
    info = inspect_bag(path, topics, options)
    return list(iter_frames(info, topics, "do it", options=options, report=report,
                            **kwargs)), report


def test_the_rule_is_nearest_in_either_order_and_ties_go_to_the_earlier():
    stamps = [0.0, 0.1, 0.2]
    assert nearest(stamps, 0.09, 0.05) == 1 and nearest(stamps, 0.11, 0.05) == 1
    assert nearest(stamps, 0.05, 0.05) == 0  # a tie: the earlier frame
    assert nearest(stamps, 0.26, 0.05) is None and nearest([], 0.0, 1.0) is None
    assert thin_to_rate([0.0, 0.033, 0.067, 0.1, 0.133, 0.167, 0.2], 10.0) == [0, 3, 6]
    assert thin_to_rate([0.0, 0.099, 0.2], 10.0) == [0, 1, 2]  # 1 ms of jitter keeps a frame


def test_a_wrist_camera_10_ms_ahead_pairs_every_frame_with_its_own(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 20, wrist_offset_s=-0.010) + _state(2.1))
    frames, report = _frames(bag)
    assert len(frames) == 20 and report.paired == 20 and not report.dropped
    for k, frame in enumerate(frames):
        assert frame.image_wrist[0, 0, 0] == frame.image_primary[0, 0, 0] == k


def test_jittered_wrist_stamps_pair_with_the_nearest_frame(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 40, wrist_offset_s=-0.010, jitter_s=0.020,
                                            seed=3) + _state(4.1))
    frames, report = _frames(bag)
    assert report.paired == 40 and not report.dropped
    assert all(f.image_wrist[0, 0, 0] == f.image_primary[0, 0, 0] for f in frames)


def test_a_30_hz_primary_with_a_10_hz_wrist_pairs_every_primary_frame(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(30, 10, 72) + _state(2.5))
    frames, report = _frames(bag)
    assert len(frames) == 72 and report.considered == 72 and report.paired == 72
    # each primary frame has the wrist frame nearest to it (k/30 s -> round(k/3) of 10 Hz,
    # a tie going to the earlier one)
    expected = [int(np.floor(k / 3 + 0.5 - 1e-9)) for k in range(72)]
    assert [int(f.image_wrist[0, 0, 0]) for f in frames] == expected
    thinned, report = _frames(bag, FrameOptions(rate_hz=10.0))
    assert report.considered == 24 and len(thinned) == 24
    assert [int(f.image_primary[0, 0, 0]) for f in thinned] == list(range(0, 72, 3))
    assert "24 primary frames considered (at most 10 Hz), 24 paired, 0 dropped" in report.line()


def test_a_lost_wrist_frame_drops_its_primary_frame_and_says_why(tmp_path):
    events = [e for e in _cameras(10, 10, 10) if not (e[0] == "/wrist" and e[3] == 4)]
    bag = _write(tmp_path / "bag", events + _state(1.1))
    frames, report = _frames(bag)
    assert [int(f.image_primary[0, 0, 0]) for f in frames] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert report.dropped == {"no /wrist message within 0.05 s": 1}
    assert report.found == {"/cam": 10, "/wrist": 10, "/js": 220, "/pose": 220}  # 11 - 1
    line = report.line()
    assert "found 10 /cam, 10 /wrist" in line and "9 paired, 1 dropped (1 no /wrist" in line


def test_the_state_is_the_message_nearest_to_the_frame(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 5) + _state(0.6, hz=7.0))
    frames, _ = _frames(bag)
    state_times = np.arange(0.0, 0.6, 1 / 7.0)
    for k, frame in enumerate(frames):
        t = state_times[np.argmin(np.abs(state_times - k / 10))]
        assert frame.extras["ee_position_m"][0] == pytest.approx(t)
        assert frame.extras["joint_positions_rad"][0] == pytest.approx(t)
        assert frame.proprio[6] == pytest.approx(0.03)  # the gripper joint's width


def test_a_joint_state_without_the_gripper_joint_stops_and_names_the_option(tmp_path):
    names = ("joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "joint7")
    bag = _write(tmp_path / "bag", _cameras(10, 10, 3) + _state(0.4), names=names)
    with pytest.raises(BagError, match=r"no joint named 'gripper'.*joint7.*--gripper-joint"):
        _frames(bag)
    frames, _ = _frames(bag, FrameOptions(gripper_joint="joint7"))
    assert len(frames) == 3 and frames[0].proprio[6] == pytest.approx(0.03)


def test_a_bag_without_state_topics_stops_unless_told_to_run_without(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 3))
    with pytest.raises(BagError) as err:
        _frames(bag)
    text = str(err.value)
    assert "/js (sensor_msgs/msg/JointState) for joint states: not in the bag" in text
    assert "--topic-joint-states" in text and "--topic-ee-pose" in text
    assert "/joint_states_single" in text and "--without-state" in text
    options = FrameOptions(without_state=True)
    info = inspect_bag(bag, TOPICS, options)
    assert any("--without-state" in w for w in info.warnings)
    frames = list(iter_frames(info, TOPICS, "do it", options=options))
    assert len(frames) == 3 and frames[0].proprio is None


def test_non_finite_state_drops_the_frame_and_names_the_topic(tmp_path):
    bad = _state(1.1, value=lambda t: np.nan if 0.28 < t < 0.32 else t)
    bag = _write(tmp_path / "bag", _cameras(10, 10, 10) + bad)
    frames, report = _frames(bag)
    assert len(frames) == 9 and report.dropped == {"non-finite values on /js": 1}
    all_bad = _write(tmp_path / "bag2", _cameras(10, 10, 3) + _state(0.4, value=lambda t: np.inf))
    with pytest.raises(BagError, match=r"no frame could be replayed.*3 non-finite values on "
                                       r"/js.*NaN or inf"):
        _frames(all_bad)


def test_frames_too_far_apart_say_which_option_widens_the_tolerance(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(5, 5, 3, wrist_offset_s=0.07) + _state(0.7))
    with pytest.raises(BagError, match=r"3 no /wrist message within 0.05 s.*--max-skew-s"):
        _frames(bag)
    frames, _ = _frames(bag, FrameOptions(pair_tolerance_s=0.08))
    assert len(frames) == 3


def test_max_frames_stops_early(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 10) + _state(1.1))
    frames, _ = _frames(bag, max_frames=4)
    assert [int(f.image_primary[0, 0, 0]) for f in frames] == [0, 1, 2, 3]


def _edit_metadata(bag, edit):
    path = bag / "metadata.yaml"
    meta = yaml.safe_load(path.read_text())
    edit(meta["rosbag2_bagfile_information"])
    path.write_text(yaml.safe_dump(meta))


def test_metadata_that_does_not_match_the_storage_file_says_so(tmp_path):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 3) + _state(0.4))

    def rename(info):
        for entry in info["topics_with_message_count"]:
            entry["topic_metadata"]["name"] += "_old"
    # metadata naming topics the storage file does not have, and counts that are wrong
    _edit_metadata(bag, rename)
    topics = BagTopics(primary="/cam_old", wrist="/wrist_old", joint_states="/js_old",
                       ee_pose="/pose_old")
    with pytest.raises(BagError, match=r"metadata.yaml does not match the storage file.*"
                                       r"/cam_old: listed 3, read 0.*ros2 bag reindex"):
        _frames(bag, topics=topics)


def test_old_metadata_with_the_bag_folder_in_the_file_paths_is_read(tmp_path):
    """rosbag2 before metadata version 4 wrote "bag/bag_0.db3"; rosbag2 and rosbags read it."""
    bag = _write(tmp_path / "bag", _cameras(10, 10, 3) + _state(0.4), version=8)

    def old(info):
        info["version"] = 3
        info["relative_file_paths"] = [f"bag/{f}" for f in info["relative_file_paths"]]
        for key in ("files", "custom_data", "ros_distro"):
            info.pop(key, None)
    _edit_metadata(bag, old)
    frames, report = _frames(bag)
    assert len(frames) == 3 and report.paired == 3


@pytest.mark.parametrize(("edit", "message"), [
    (lambda i: i.update(version=42), r"version 42; this reader \(rosbags\) reads versions 1..9"),
    (lambda i: i.update(storage_identifier="bag_v1"), r"storage plugin 'bag_v1' is not "
                                                     r"supported"),
    (lambda i: i["topics_with_message_count"][0]["topic_metadata"].update(
        serialization_format="json"), r"serialized as \['json'\]; only cdr"),
    (lambda i: i.update(relative_file_paths=[*i["relative_file_paths"], "bag_1.mcap"]),
     r"split over 2 files .* \['bag_1.mcap'\] are missing"),
])
def test_metadata_problems_name_their_cause_not_truncation(tmp_path, edit, message):
    bag = _write(tmp_path / "bag", _cameras(10, 10, 2) + _state(0.3))
    _edit_metadata(bag, edit)
    with pytest.raises(BagError, match=message) as err:
        _frames(bag)
    assert "truncated" not in str(err.value)


def test_a_folder_of_bags_asks_for_one_of_them(tmp_path):
    for name in ("a", "b"):
        _write(tmp_path / "runs" / name, _cameras(10, 10, 1) + _state(0.1))
    with pytest.raises(BagError, match=r"is a folder of 2 bags \(a, b\), not a bag; pass one") \
            as err:
        _frames(tmp_path / "runs")
    assert "reindex" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BagError, match="not a rosbag2 directory") as err:
        _frames(tmp_path / "empty")
    assert "reindex" not in str(err.value)
