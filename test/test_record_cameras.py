"""heisd-record --camera-format and heisd-replay of mono8 and compressed cameras.

One short expert episode (same seed, 32 px, 3 steps) is recorded in every camera format; the
simulator is deterministic, so each bag's images are compared with the rgb8 recording's, and
replays through AR (tiny random VLA) are compared with the rgb8 bag's replay.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd_ros.data.rosbag_io import (
    CAMERA_FORMATS,
    COMPRESSED_IMAGE_TYPE,
    IMAGE_TYPE,
    TOPIC_THIRD_PERSON,
    TOPIC_WRIST,
    bag_topic_summary,
    camera_msg,
    image_from_msg,
    make_typestore,
    read_bag_messages,
)
from heisd_ros.tools import record, replay

SUITE, TASK, STEPS = "piper_goal", "red_block_on_plate", 3


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    """{camera format: bag directory} of the same expert episode."""
    out = {}
    for camera_format in CAMERA_FORMATS:
        root = tmp_path_factory.mktemp(camera_format)
        code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "expert", "--episodes",
                            "1", "--max-steps", str(STEPS), "--image-size", "32", "--out",
                            str(root), "--camera-format", camera_format])
        assert code == 0
        out[camera_format] = root / SUITE / TASK / "episode_000000_bag"
    return out


def _images(bag, topic):
    return [image_from_msg(m) for _, _, m in read_bag_messages(bag, [topic])]


@pytest.mark.parametrize("camera_format", CAMERA_FORMATS)
def test_recorded_cameras_in_each_format(bags, camera_format):
    compressed = camera_format in ("jpeg", "png")
    summary = bag_topic_summary(bags[camera_format])
    for topic in (TOPIC_THIRD_PERSON, TOPIC_WRIST):
        name = topic + "/compressed" if compressed else topic
        assert summary[name] == (COMPRESSED_IMAGE_TYPE if compressed else IMAGE_TYPE, STEPS)
        assert (topic in summary) != compressed
        reference = np.stack(_images(bags["rgb8"], topic))
        images = np.stack(_images(bags[camera_format], name))
        assert images.shape == (STEPS, 32, 32, 3)
        if camera_format == "jpeg":
            assert np.abs(images.astype(int) - reference).mean() < 6
        elif camera_format == "mono8":
            luma = np.round(reference @ np.array([0.299, 0.587, 0.114])).astype(np.uint8)
            np.testing.assert_array_equal(images, np.repeat(luma[..., None], 3, axis=3))
        else:
            np.testing.assert_array_equal(images, reference)
    first = next(m for _, _, m in read_bag_messages(
        bags[camera_format], [TOPIC_WRIST + ("/compressed" if compressed else "")]))
    if compressed:
        assert first.format == f"rgb8; {camera_format} compressed bgr8"
    else:
        assert first.encoding == camera_format


def _replay_ar(bag, target, tmp_path, capsys, *extra) -> dict:
    out = tmp_path / f"{bag.parent.parent.parent.name}.json"
    code = replay.main([str(bag), "--methods", "ar", "--target", target, "--json", str(out),
                        *extra])
    assert code == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def _ar_actions(result) -> list:
    return [f["methods"]["ar"]["action"] for f in result["frames"]]


def test_mono8_bag_replays_through_ar(bags, tiny_target_path, tmp_path, capsys):
    result = _replay_ar(bags["mono8"], tiny_target_path, tmp_path, capsys)
    assert len(result["frames"]) == STEPS
    assert result["topics"]["primary"] == TOPIC_THIRD_PERSON
    assert result["methods"]["ar"]["agreement_with_ar"]["exact_token_rate"] == 1.0


def test_compressed_bags_replay_through_ar(bags, tiny_target_path, tmp_path, capsys):
    reference = _replay_ar(bags["rgb8"], tiny_target_path, tmp_path, capsys)
    for camera_format in ("jpeg", "png"):
        # No --topic-* given: the cameras' image_transport /compressed topics are found.
        result = _replay_ar(bags[camera_format], tiny_target_path, tmp_path, capsys)
        assert result["topics"]["primary"] == TOPIC_THIRD_PERSON + "/compressed"
        assert result["topics"]["wrist"] == TOPIC_WRIST + "/compressed"
        assert len(result["frames"]) == STEPS
        assert result["methods"]["ar"]["agreement_with_ar"]["exact_token_rate"] == 1.0
        if camera_format == "png":  # lossless: the very pixels, so the very actions
            assert _ar_actions(result) == _ar_actions(reference)


def test_each_camera_its_own_type(tiny_target_path, tmp_path, capsys):
    """Primary camera raw bgr8, wrist camera jpeg on /compressed (found without options)."""
    from rosbags.rosbag2 import Writer

    ts = make_typestore()
    rng = np.random.default_rng(0)
    with Writer(tmp_path / "bag", version=9) as writer:
        writer.set_custom_data("heisd.instruction", "put the red block on the plate")
        conns = {"bgr8": writer.add_connection(TOPIC_THIRD_PERSON, IMAGE_TYPE, typestore=ts),
                 "jpeg": writer.add_connection(TOPIC_WRIST + "/compressed",
                                               COMPRESSED_IMAGE_TYPE, typestore=ts)}
        for k in range(2):
            ns = 10**9 + k * 10**8
            header = ts.types["std_msgs/msg/Header"](
                stamp=ts.types["builtin_interfaces/msg/Time"](sec=1, nanosec=k * 10**8),
                frame_id="cam")
            image = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
            for fmt, conn in conns.items():
                msg = camera_msg(ts, header, image, fmt)
                writer.write(conn, ns, ts.serialize_cdr(msg, conn.msgtype))
    result = _replay_ar(tmp_path / "bag", tiny_target_path, tmp_path, capsys, "--without-state")
    assert result["topics"]["primary"] == TOPIC_THIRD_PERSON
    assert result["topics"]["wrist"] == TOPIC_WRIST + "/compressed"
    assert len(result["frames"]) == 2
