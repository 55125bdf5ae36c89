"""heisd-replay on bags it cannot replay: exit code 2 and a precise message, no traceback.

The fixtures (test/data/rosbag2, copied from the shared ones) are real ``ros2 bag record``
bags (a talker: std_msgs/String on /topic, plus /rosout and /parameter_events) in both
storages; damaged variants (split, truncated, emptied, without metadata) are made from
copies. Camera bags with images the policy refuses are written with rosbags.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from heisd_ros.data.rosbag_io import (
    COMPRESSED_IMAGE_TYPE,
    IMAGE_TYPE,
    TOPIC_THIRD_PERSON,
    TOPIC_WRIST,
    camera_msg,
    make_typestore,
)
from heisd_ros.tools.replay import main

FIXTURES = Path(__file__).resolve().parent / "data" / "rosbag2"  # see its README.md
STORAGE_FILES = [("mcap", "talker.mcap"), ("sqlite3", "talker.db3")]


def _replay(capsys, *argv) -> str:
    code = main([*map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2, err
    # The message starts the output, or follows the progress bar of a replay it stopped.
    assert "Traceback" not in err and f"\n{err}".count("\nheisd-replay: ") == 1, err
    return err


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    dst.chmod(0o755)
    return dst


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_real_bag_without_the_needed_topics(capsys, storage):
    err = _replay(capsys, FIXTURES / f"talker_{storage}")
    # What was found: every topic with its type and count.
    assert "/topic  std_msgs/msg/String  (10 messages)" in err
    assert "/rosout  rcl_interfaces/msg/Log  (10 messages)" in err
    # What is needed and how to remap.
    assert "/camera/third_person/image_raw (sensor_msgs/msg/Image" in err
    assert "/camera/wrist/image_raw" in err and "not in the bag" in err
    for option in ("--topic-primary", "--topic-wrist", "--topic-joint-states", "--topic-ee-pose"):
        assert option in err


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_remap_to_a_topic_of_another_type(capsys, storage):
    err = _replay(capsys, FIXTURES / f"talker_{storage}", "--topic-primary", "/topic",
                  "--topic-wrist", "")
    assert "/topic: has type std_msgs/msg/String, replay needs sensor_msgs/msg/Image" in err
    assert "--topic-primary" in err and "wrist" not in err.split("Needed:")[1].split("\n")[1]


def test_missing_path_file_and_plain_directory(capsys, tmp_path):
    assert "no such file or directory" in _replay(capsys, tmp_path / "nope")
    err = _replay(capsys, FIXTURES / "talker_sqlite3" / "talker.db3")
    assert "is a file" in err and str(FIXTURES / "talker_sqlite3") in err
    (tmp_path / "plain").mkdir()
    assert "no metadata.yaml" in _replay(capsys, tmp_path / "plain")


def test_empty_bag(capsys, tmp_path):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    with Writer(tmp_path / "empty", version=9) as writer:
        writer.add_connection("/camera/third_person/image_raw", "sensor_msgs/msg/Image",
                              typestore=ts)
    err = _replay(capsys, tmp_path / "empty")
    assert "the bag is empty (0 messages)" in err
    assert "/camera/third_person/image_raw  sensor_msgs/msg/Image  (0 messages)" in err


@pytest.mark.parametrize("keep", [0.5, 0.0])
@pytest.mark.parametrize(("storage", "file"), STORAGE_FILES)
def test_truncated_or_emptied_storage_file(capsys, tmp_path, storage, file, keep):
    bag = _copy(f"talker_{storage}", tmp_path)
    data = (bag / file).read_bytes()
    (bag / file).write_bytes(data[: int(len(data) * keep)])
    err = _replay(capsys, bag)
    assert "truncated or corrupt" in err and storage in err and file in err


def _split(bag: Path, file: str) -> str:
    """List a second part in the bag's metadata; returns its name."""
    part = file.replace("talker.", "talker_1.")
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    meta["rosbag2_bagfile_information"]["relative_file_paths"].append(part)
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    return part


@pytest.mark.parametrize(("storage", "file"), STORAGE_FILES)
def test_split_bag_with_a_missing_part(capsys, tmp_path, storage, file):
    bag = _copy(f"talker_{storage}", tmp_path)
    part = _split(bag, file)
    err = _replay(capsys, bag)
    assert "split over 2 files" in err and part in err and "missing" in err
    assert "ros2 bag reindex" in err


@pytest.mark.parametrize(("storage", "file"), STORAGE_FILES)
def test_split_bag_with_every_part_is_checked_like_one_file(capsys, tmp_path, storage, file):
    bag = _copy(f"talker_{storage}", tmp_path)
    shutil.copy(bag / file, bag / _split(bag, file))
    err = _replay(capsys, bag)
    assert "/topic  std_msgs/msg/String" in err and "--topic-primary TOPIC" in err


def test_storage_files_without_metadata(capsys, tmp_path):
    bag = _copy("talker_mcap", tmp_path)
    (bag / "metadata.yaml").unlink()
    err = _replay(capsys, bag)
    assert "no metadata.yaml" in err and "talker.mcap" in err
    assert f"ros2 bag reindex {bag}" in err


def test_metadata_that_is_not_yaml(capsys, tmp_path):
    bag = _copy("talker_sqlite3", tmp_path)
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [\n")
    err = _replay(capsys, bag)
    assert "metadata.yaml is unreadable" in err and "ros2 bag reindex" in err


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_truncated_zstd_compressed_bag(capsys, tmp_path, storage):
    """``ros2 bag record --compression-mode file``: the storage file is one zstd stream."""
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer

    ts = make_typestore()
    writer = Writer(tmp_path / "bag", version=9, storage_plugin=getattr(StoragePlugin,
                                                                          storage.upper()))
    writer.set_compression(CompressionMode.FILE, CompressionFormat.ZSTD)
    with writer:
        conn = writer.add_connection(TOPIC_THIRD_PERSON, IMAGE_TYPE, typestore=ts)
        for k in range(5):
            msg = camera_msg(ts, _header(ts, k), np.full((8, 8, 3), k, np.uint8))
            writer.write(conn, 10**9 + k, ts.serialize_cdr(msg, IMAGE_TYPE))
    (part,) = (tmp_path / "bag").glob("*.zstd")
    part.write_bytes(part.read_bytes()[:-20])
    err = _replay(capsys, tmp_path / "bag", "--topic-wrist", "")
    assert "truncated or corrupt" in err and part.name in err


def _header(ts, k: int):
    return ts.types["std_msgs/msg/Header"](
        stamp=ts.types["builtin_interfaces/msg/Time"](sec=1, nanosec=k * 10**8), frame_id="cam")


def _camera_bag(path: Path, cameras: dict[str, list]) -> Path:
    """A bag with an instruction and, per topic, messages built by ``make(ts, header)``."""
    from rosbags.rosbag2 import Writer

    ts = make_typestore()
    with Writer(path, version=9) as writer:
        writer.set_custom_data("heisd.instruction", "put the red block on the plate")
        conns = {topic: writer.add_connection(topic, msgtype, typestore=ts)
                 for topic, (msgtype, _) in cameras.items()}
        for k in range(max(len(makes) for _, makes in cameras.values())):
            for topic, (msgtype, makes) in cameras.items():
                if k < len(makes):
                    msg = makes[k](ts, _header(ts, k))
                    writer.write(conns[topic], 10**9 + k * 10**8, ts.serialize_cdr(msg, msgtype))
    return path


def _raw(encoding: str, channels: int):
    def make(ts, header):
        return ts.types[IMAGE_TYPE](header=header, height=16, width=16, encoding=encoding,
                                    is_bigendian=0, step=16 * channels,
                                    data=np.zeros(256 * channels, np.uint8))
    return make


def _rgb(ts, header):
    return camera_msg(ts, header, np.zeros((16, 16, 3), np.uint8))


@pytest.mark.parametrize(("encoding", "channels", "role", "option"), [
    ("16UC1", 2, "primary", "--topic-primary"), ("bayer_rggb8", 1, "wrist", "--topic-wrist"),
    ("rgba8", 4, "wrist", "--topic-wrist")])
def test_camera_with_an_encoding_the_policy_refuses(capsys, tmp_path, encoding, channels, role,
                                                    option):
    """Found before any model loads (--target does not exist): no checkpoint error."""
    topic = TOPIC_THIRD_PERSON if role == "primary" else TOPIC_WRIST
    other = TOPIC_WRIST if role == "primary" else TOPIC_THIRD_PERSON
    bag = _camera_bag(tmp_path / "bag", {topic: (IMAGE_TYPE, [_raw(encoding, channels)] * 2),
                                         other: (IMAGE_TYPE, [_rgb] * 2)})
    err = _replay(capsys, bag, "--without-state", "--target", tmp_path / "missing.safetensors")
    assert f"{topic} (sensor_msgs/msg/Image): unsupported image encoding '{encoding}'" in err
    assert "['bgr8', 'mono8', 'rgb8']" in err and "jpeg or png" in err
    assert f"remap with {option} TOPIC" in err


def test_encoding_change_mid_bag_stops_replay_with_the_topic(capsys, tmp_path):
    from heisd_ros.models.checkpoint import save_small_vla
    from heisd_ros.models.small_vla import SmallVLA
    from test.fixtures_decoding import TINY

    target = save_small_vla(SmallVLA.random(TINY, seed=1), tmp_path / "tiny.safetensors")
    frames = [_rgb, _raw("yuv422", 2)]  # the first frame passes the check before loading
    bag = _camera_bag(tmp_path / "bag", {TOPIC_THIRD_PERSON: (IMAGE_TYPE, frames)})
    err = _replay(capsys, bag, "--without-state", "--topic-wrist", "", "--methods", "ar",
                  "--target", target)
    assert f"{TOPIC_THIRD_PERSON}: unsupported image encoding 'yuv422'" in err


def test_missing_checkpoint_is_a_message(capsys, tmp_path):
    bag = _camera_bag(tmp_path / "bag", {TOPIC_THIRD_PERSON: (IMAGE_TYPE, [_rgb])})
    err = _replay(capsys, bag, "--without-state", "--topic-wrist", "", "--target",
                  tmp_path / "nope.safetensors")
    assert "nope.safetensors" in err


def _compressed(fmt: str, data: bytes):
    def make(ts, header):
        return ts.types[COMPRESSED_IMAGE_TYPE](header=header, format=fmt,
                                               data=np.frombuffer(data, np.uint8))
    return make


@pytest.mark.parametrize(("fmt", "data", "message"), [
    ("tiff", b"II*\x00", "unsupported compressed image format 'tiff'; accepted: "
                         "['jpeg', 'png']"),
    ("rgb8; jpeg compressed bgr8", b"\xff\xd8\xff", "corrupt 'rgb8; jpeg compressed bgr8' "
                                                    "image data (3 bytes)")])
def test_compressed_camera_the_policy_refuses(capsys, tmp_path, fmt, data, message):
    topic = TOPIC_WRIST + "/compressed"
    bag = _camera_bag(tmp_path / "bag", {TOPIC_THIRD_PERSON: (IMAGE_TYPE, [_rgb]),
                                         topic: (COMPRESSED_IMAGE_TYPE, [_compressed(fmt, data)])})
    err = _replay(capsys, bag, "--without-state", "--target", tmp_path / "missing.safetensors")
    assert f"{topic} (sensor_msgs/msg/CompressedImage): {message}" in err
    assert "remap with --topic-wrist TOPIC" in err


def test_unknown_method_lists_valid_names(capsys):
    err = _replay(capsys, FIXTURES / "talker_mcap", "--methods", "nope")
    assert "unknown method 'nope'; valid: ar, " in err
