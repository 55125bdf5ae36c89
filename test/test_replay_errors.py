"""heisd-replay on bags it cannot replay: exit code 2 and a precise message, no traceback.

The shared fixtures are real ``ros2 bag record`` bags (a talker: std_msgs/String on /topic,
plus /rosout and /parameter_events) in both storages.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from heisd_ros.tools.replay import main

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "rosbag2"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/rosbag2")
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared rosbag2 fixtures missing")


def _replay(capsys, *argv) -> str:
    code = main([*map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("heisd-replay: ")
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
    assert "/camera/third_person/image_raw (sensor_msgs/msg/Image)" in err
    assert "/camera/wrist/image_raw" in err
    for option in ("--topic-primary", "--topic-wrist", "--topic-joint-states", "--topic-ee-pose"):
        assert option in err


def test_remap_to_a_topic_of_another_type(capsys):
    err = _replay(capsys, FIXTURES / "talker_mcap", "--topic-primary", "/topic",
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


@pytest.mark.parametrize(("storage", "file"), [("mcap", "talker.mcap"),
                                               ("sqlite3", "talker.db3")])
def test_truncated_storage_file(capsys, tmp_path, storage, file):
    bag = _copy(f"talker_{storage}", tmp_path)
    data = (bag / file).read_bytes()
    (bag / file).write_bytes(data[: len(data) // 2])
    err = _replay(capsys, bag)
    assert "truncated or corrupt" in err and storage in err


def test_split_bag_with_a_missing_part(capsys, tmp_path):
    bag = _copy("talker_mcap", tmp_path)
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    meta["rosbag2_bagfile_information"]["relative_file_paths"].append("talker_1.mcap")
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    err = _replay(capsys, bag)
    assert "split over 2 files" in err and "talker_1.mcap" in err and "missing" in err


def test_unknown_method_lists_valid_names(capsys):
    assert "valid names are" in _replay(capsys, FIXTURES / "talker_mcap", "--methods", "nope")
