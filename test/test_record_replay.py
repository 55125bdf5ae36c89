"""heisd-record -> heisd-replay round trip on a tiny random VLA; replay of other bags.

Tiny sizes keep it fast on the shared machine: 32 px cameras, 3 control steps.
"""

from __future__ import annotations

import json

import pytest

from heisd_ros.data.rosbag_io import bag_topic_summary, make_typestore, write_episode_bag
from heisd_ros.eval.recording import (
    HYBRID_STEP_TYPE,
    TOPIC_HYBRID_STEP,
    make_recording_typestore,
)
from heisd_ros.tools import record, replay
from test.test_data_npz import synthetic_record

SUITE, TASK = "piper_goal", "red_block_on_plate"


@pytest.fixture(scope="module")
def recorded_bag(tiny_target_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("bags")
    code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "drafter", "--episodes",
                        "1", "--max-steps", "6", "--image-size", "32", "--target",
                        tiny_target_path, "--out", str(out), "--storage", "sqlite3"])
    assert code == 0
    return out / SUITE / TASK / "episode_000000_bag"


def test_recorded_bag_has_the_robot_topics_and_hybrid_steps(recorded_bag):
    summary = bag_topic_summary(recorded_bag)
    assert summary[TOPIC_HYBRID_STEP] == (HYBRID_STEP_TYPE, 6)
    assert summary["/camera/wrist/image_raw"] == ("sensor_msgs/msg/Image", 6)
    assert list(recorded_bag.glob("*.db3"))
    from heisd_ros.data.rosbag_io import read_bag_messages

    msgs = [m for _, _, m in read_bag_messages(recorded_bag, [TOPIC_HYBRID_STEP],
                                               typestore=make_recording_typestore())]
    assert [m.step_index for m in msgs] == list(range(6))
    assert msgs[0].router_mode == 2 and msgs[0].target_forwards >= 1 and msgs[0].total_ms > 0


def test_round_trip_replay_report(recorded_bag, tiny_target_path, tmp_path, capsys):
    out = tmp_path / "report"
    code = replay.main([str(recorded_bag), "--methods", "ar", "drafter", "--target",
                        tiny_target_path, "--json", str(tmp_path / "r.json"), "--report",
                        str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["instruction"] == "put the red block on the plate"
    assert len(result["frames"]) == 6
    assert result["pairing"]["paired"] == 6 and not result["pairing"]["dropped"]
    from heisd_ros.data.rosbag_io import read_bag_messages

    poses = [m.pose.position for _, _, m in read_bag_messages(recorded_bag, ["/ee_pose"])]
    for frame, pose in zip(result["frames"], poses, strict=True):
        ar = frame["methods"]["ar"]["agreement"]
        assert ar["exact_token_rate"] == 1.0 and ar["translation_error_mm"] == 0.0
        # Each frame carries the state logged with its own images, not the previous step's.
        assert frame["ee_position_m"] == pytest.approx([pose.x, pose.y, pose.z])
    total = result["methods"]["ar"]["agreement_with_ar"]
    assert total["exact_token_rate"] == 1.0 and total["gripper_agreement"] == 1.0
    assert result["methods"]["ar"]["target_forwards_per_action"] == 7.0
    assert result["methods"]["ar"]["speedup_vs_ar_mean"] == pytest.approx(1.0)
    # the ratio of mean step latencies, AR over drafter, of the frames in the same result
    ms = {name: [f["methods"][name]["stage_ms"]["total"] for f in result["frames"]]
          for name in ("ar", "drafter")}
    assert all(t > 0 for t in ms["ar"] + ms["drafter"])
    assert result["methods"]["drafter"]["speedup_vs_ar_mean"] == pytest.approx(
        sum(ms["ar"]) / sum(ms["drafter"]))
    assert "drafter" in result["methods"] and "PROJECTION" in result["projection"]["label"]
    for name in ("report.md", "trajectories.png", "latency_per_step.png",
                 "accepted_length_hist.png", "agreement_vs_speedup.png"):
        assert (out / name).stat().st_size > 0, name
    text = (out / "report.md").read_text()
    assert "## Per frame" in text and "## Projection" in text and "(trajectories.png)" in text
    out_text = capsys.readouterr().out
    assert "exact tok" in out_text
    assert "6 primary frames considered (every frame), 6 paired, 0 dropped" in out_text
    assert result["pairing"]["line"] in text


def _shift_wrist(src, dst, offsets_s):
    """A copy of bag ``src`` whose k-th wrist image is stamped ``offsets_s[k]`` later."""
    from rosbags.rosbag2 import Reader, Writer

    from heisd_ros.data.bag_topics import bag_information

    ts = make_recording_typestore()
    custom = bag_information(src).get("custom_data") or {}
    with Reader(src) as reader, Writer(dst, version=9) as writer:
        for key, value in custom.items():
            writer.set_custom_data(key, str(value))
        conns = {c.id: writer.add_connection(c.topic, c.msgtype, typestore=ts)
                 for c in reader.connections}
        k = 0
        for conn, log_ns, raw in reader.messages():
            if conn.topic == "/camera/wrist/image_raw":
                msg = ts.deserialize_cdr(raw, conn.msgtype)
                ns = (msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
                      + int(round(offsets_s[k] * 1e9)))
                msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(ns, 10**9)
                raw, k = ts.serialize_cdr(msg, conn.msgtype), k + 1
            writer.write(conns[conn.id], log_ns, raw)
    return dst


def test_a_wrist_camera_ahead_and_jittered_replays_like_the_synchronised_one(
        recorded_bag, tiny_target_path, tmp_path, capsys):
    """Wrist stamps 10 ms early and jittered by +-20 ms: every frame paired, same actions."""
    import numpy as np

    offsets = -0.010 + np.random.default_rng(7).uniform(-0.020, 0.020, size=6)
    shifted = _shift_wrist(recorded_bag, tmp_path / "shifted", offsets)
    results = {}
    for name, bag in (("synchronised", recorded_bag), ("shifted", shifted)):
        assert replay.main([str(bag), "--methods", "ar", "--target", tiny_target_path,
                            "--json", str(tmp_path / f"{name}.json")]) == 0, \
            capsys.readouterr().err
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert results["shifted"]["pairing"]["paired"] == 6
    assert not results["shifted"]["pairing"]["dropped"]
    for name in results:
        results[name] = [(f["methods"]["ar"]["bins"], f["methods"]["ar"]["action"])
                         for f in results[name]["frames"]]
    assert results["shifted"] == results["synchronised"]


def test_replay_of_a_write_episode_bag_without_wrist_camera(tiny_target_path, tmp_path, capsys):
    bag = write_episode_bag(synthetic_record(steps=4, size=24), tmp_path / "bag",
                            typestore=make_typestore())
    code = replay.main([str(bag), "--methods", "ar", "--target", tiny_target_path,
                        "--topic-wrist", "", "--max-frames", "2", "--json",
                        str(tmp_path / "r.json")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert len(result["frames"]) == 2 and list(result["methods"]) == ["ar"]


def test_bag_without_instruction_asks_for_one(tmp_path, capsys):
    from rosbags.rosbag2 import Writer

    ts = make_typestore()
    with Writer(tmp_path / "bag", version=9) as writer:
        conn = writer.add_connection("/camera/third_person/image_raw", "sensor_msgs/msg/Image",
                                     typestore=ts)
        msg = ts.types["sensor_msgs/msg/Image"](
            header=ts.types["std_msgs/msg/Header"](
                stamp=ts.types["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id="c"),
            height=16, width=16, encoding="rgb8", is_bigendian=0, step=48,
            data=__import__("numpy").zeros(16 * 48, dtype="uint8"))
        writer.write(conn, 1, ts.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    assert replay.main([str(tmp_path / "bag"), "--topic-wrist", "", "--without-state"]) == 2
    assert "pass --instruction" in capsys.readouterr().err


def test_recording_again_needs_overwrite_and_replaces_only_that_bag(tmp_path, capsys):
    args = ["--suite", SUITE, "--task", TASK, "--policy", "expert", "--episodes", "1",
            "--max-steps", "2", "--image-size", "32", "--out", str(tmp_path)]
    assert record.main(args) == 0
    bag = tmp_path / SUITE / TASK / "episode_000000_bag"
    neighbour = tmp_path / SUITE / TASK / "notes.txt"
    neighbour.write_text("keep me")
    stamp = (bag / "metadata.yaml").stat().st_mtime_ns
    assert record.main(args) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert record.main([*args, "--overwrite"]) == 0
    assert (bag / "metadata.yaml").stat().st_mtime_ns != stamp
    assert neighbour.read_text() == "keep me"
