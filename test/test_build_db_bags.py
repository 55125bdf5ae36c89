"""heisd-build-db from rosbag2: a recorded sim episode gives the same DB as its npz.

Plus the bag reader on a bag shaped like ``ros2 bag record`` of the live system (other topic
names, no heisd custom data, cameras and state at their own rates) and its error messages.
Tiny sizes keep it fast on the shared machine: 32 px cameras, 4 control steps.
"""

from __future__ import annotations

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from heisd_ros.data.bag_episodes import (
    BagEpisodeError,
    EpisodeDefaults,
    EpisodeTopics,
    load_any_episode,
    load_bag_episode,
)
from heisd_ros.data.npz_episodes import episode_path, save_episode
from heisd_ros.data.rosbag_io import EE_COMMAND_TYPE, make_typestore, write_episode_bag
from heisd_ros.eval import recording
from heisd_ros.retrieval.store import open_store
from heisd_ros.retrieval.store_config import StoreConfig
from heisd_ros.tools import build_db, record

SUITE, TASK = "piper_goal", "red_block_on_plate"
STEPS = 4


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """heisd-record of one expert episode (sqlite3); the same episode saved as npz and MCAP."""
    root = tmp_path_factory.mktemp("rec")
    captured = []
    finish = recording.EpisodeTape.finish

    def keep(self, episode, success):
        captured.append(finish(self, episode, success))
        return captured[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recording.EpisodeTape, "finish", keep)
        code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "expert",
                            "--episodes", "1", "--max-steps", str(STEPS), "--image-size", "32",
                            "--out", str(root / "bags"), "--storage", "sqlite3"])
    assert code == 0 and len(captured) == 1
    episode = captured[0]
    save_episode(episode, episode_path(root / "npz", SUITE, TASK, episode.seed))
    write_episode_bag(episode, root / "mcap" / "episode_bag", storage="mcap")
    return root, episode


def build(demos, db, checkpoint, *extra):
    return build_db.main(["--demos", str(demos), "--db", str(db), "--target", str(checkpoint),
                          "--router-window", "3", "--exact", "--hold-out-every", "0", *extra])


def all_points(db):
    """Every point of the task: id -> (payload, score against a fixed query)."""
    store = open_store(StoreConfig(path=str(db), exact_search=True))
    try:
        n = store.count(TASK)
        query = np.random.default_rng(0).normal(size=store.dimension)
        return {h.id: (h.payload, h.score) for h in store.search(TASK, query, k=n)}
    finally:
        store.close()


def test_bag_reads_back_as_the_recorded_episode(recorded):
    root, episode = recorded
    bag = next((root / "bags").rglob("metadata.yaml")).parent
    back = load_bag_episode(bag)
    assert (back.suite, back.task, back.instruction, back.seed) == \
        (SUITE, TASK, episode.instruction, episode.seed)
    assert back.num_steps == STEPS == episode.num_steps
    for name in ("image_third_person", "image_wrist", "joint_positions_rad", "gripper_width_m",
                 "ee_position_m", "ee_quat_xyzw", "action"):
        np.testing.assert_array_equal(getattr(back, name), getattr(episode, name), err_msg=name)
    np.testing.assert_allclose(back.stamp_s, episode.stamp_s, atol=1e-9)  # ns in the bag
    angle = np.angle(np.exp(1j * (back.ee_rpy_rad - episode.ee_rpy_rad)))  # wrap at +-pi
    assert np.abs(angle).max() < 1e-5
    assert back.control_rate_hz == pytest.approx(10.0)
    assert back.metadata["dropped_commands"] == 0
    npz = next((root / "npz").rglob("*.npz"))
    for path in (bag, npz):   # what a held-out list may hold after a bag or an npz build
        np.testing.assert_array_equal(load_any_episode(path).action, episode.action)


def test_db_from_bags_matches_db_from_npz(recorded, tiny_target_path, tmp_path):
    root, _ = recorded
    assert build(root / "npz", tmp_path / "db_npz", tiny_target_path) == 0
    assert build(root / "bags", tmp_path / "db_sqlite", tiny_target_path) == 0
    mcap = root / "mcap" / "episode_bag"
    assert build(mcap, tmp_path / "db_mcap", tiny_target_path, "--demos-format", "bag") == 0
    want = all_points(tmp_path / "db_npz")
    assert len(want) == STEPS
    for db in ("db_sqlite", "db_mcap"):
        got = all_points(tmp_path / db)
        assert sorted(got) == sorted(want), db
        for i, (payload, score) in want.items():
            assert got[i][0] == payload, (db, i)
            assert got[i][1] == pytest.approx(score, abs=1e-5), (db, i)


def test_db_from_a_bag_with_png_compressed_cameras_matches_npz(recorded, tiny_target_path,
                                                               tmp_path):
    """CompressedImage cameras (heisd-record --camera-format png: lossless) build the same DB."""
    root, episode = recorded
    code = record.main(["--suite", SUITE, "--task", TASK, "--policy", "expert", "--episodes",
                        "1", "--max-steps", str(STEPS), "--image-size", "32", "--camera-format",
                        "png", "--out", str(tmp_path / "png"), "--storage", "mcap"])
    assert code == 0
    assert build(root / "npz", tmp_path / "db_npz", tiny_target_path) == 0
    topics = ["--topic-primary", "/camera/third_person/image_raw/compressed",
              "--topic-wrist", "/camera/wrist/image_raw/compressed"]
    assert build(tmp_path / "png", tmp_path / "db_png", tiny_target_path, *topics) == 0
    # without the options: the default camera topics are not there, their /compressed are
    assert build(tmp_path / "png", tmp_path / "db_auto", tiny_target_path) == 0
    want = all_points(tmp_path / "db_npz")
    for db in ("db_png", "db_auto"):
        got = all_points(tmp_path / db)
        assert sorted(got) == sorted(want)
        for i, (payload, score) in want.items():
            assert got[i][0] == payload and got[i][1] == pytest.approx(score, abs=1e-5), i


# ------------------------------------------------------------------ a live-system-like bag
LIVE = EpisodeTopics(primary="/cam_high/image_raw", wrist="/cam_wrist/image_raw",
                     joint_states="/piper/joint_states", ee_pose="/piper/ee_pose",
                     ee_command="/heisd/ee_command")


def _live_bag(path, *, with_command: bool = True, resize_from: int | None = None,
              gripper_name: str = "gripper", nan_pose: range = range(0)) -> dict:
    """Cameras at 30 Hz (wrist 3 ms late), state at 100 Hz, commands at 10 Hz, no custom data.

    Each command carries the stamp of the primary frame it was decided on; one extra command
    carries a stamp no frame has (dropped). ``resize_from``: the primary camera's frames from
    this one on are 4 px wider; ``gripper_name``: the JointState name of the gripper.
    """
    ts = make_typestore()
    types = ts.types
    rng = np.random.default_rng(1)
    t0 = 1_700_000_000_000_000_000
    frames = {k: t0 + k * 33_333_333 for k in range(30)}
    images = {k: rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) for k in frames}
    wide = {k: rng.integers(0, 256, (12, 20, 3), dtype=np.uint8) for k in frames
            if resize_from is not None and k >= resize_from}
    decided = [0, 3, 6, 9, 12]
    actions = {k: np.r_[rng.normal(0, 0.01, 6), float(k >= 6)] for k in decided}

    def stamp(ns):
        return types["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)

    def header(ns, frame="base_link"):
        return types["std_msgs/msg/Header"](stamp=stamp(ns), frame_id=frame)

    def image(ns, data, encoding="rgb8"):
        return types["sensor_msgs/msg/Image"](
            header=header(ns, "cam"), height=data.shape[0], width=data.shape[1],
            encoding=encoding, is_bigendian=0, step=data.shape[1] * 3, data=data.reshape(-1))

    msgs = []
    for k, ns in frames.items():
        msgs.append((LIVE.primary, ns + 2_000_000, image(ns, wide.get(k, images[k]))))
        msgs.append((LIVE.wrist, ns + 5_000_000, image(ns + 3_000_000,
                                                       images[k][..., ::-1].copy(), "bgr8")))
    for j in range(100):
        ns = t0 + j * 10_000_000
        msgs.append((LIVE.joint_states, ns, types["sensor_msgs/msg/JointState"](
            header=header(ns), name=[gripper_name, *[f"joint{i}" for i in range(1, 7)]],
            position=np.r_[0.05, np.arange(6) + j], velocity=np.zeros(0),
            effort=np.zeros(0))))
        msgs.append((LIVE.ee_pose, ns, types["geometry_msgs/msg/PoseStamped"](
            header=header(ns), pose=types["geometry_msgs/msg/Pose"](
                position=types["geometry_msgs/msg/Point"](
                    x=np.nan if j in nan_pose else j * 1e-3, y=0.0, z=0.2),
                orientation=types["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0,
                                                                  w=1.0)))))
    vec3 = types["geometry_msgs/msg/Vector3"]
    commands = [(frames[k], actions[k]) for k in decided] + [(t0 + 2 * 10**9, np.zeros(7))]
    for i, (ns, a) in enumerate(commands if with_command else []):
        msgs.append((LIVE.ee_command, ns + 80_000_000, types[EE_COMMAND_TYPE](
            header=header(ns), step_index=i, mode=0, translation_m=vec3(*a[:3]),
            rotation_rad=vec3(*a[3:6]), gripper=int(a[6]), gripper_from_target=True,
            source=4)))
    msgtypes = {LIVE.primary: "sensor_msgs/msg/Image", LIVE.wrist: "sensor_msgs/msg/Image",
                LIVE.joint_states: "sensor_msgs/msg/JointState",
                LIVE.ee_pose: "geometry_msgs/msg/PoseStamped", LIVE.ee_command: EE_COMMAND_TYPE}
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conns = {t: writer.add_connection(t, m, typestore=ts) for t, m in msgtypes.items()
                 if with_command or t != LIVE.ee_command}
        for topic, log_ns, msg in sorted(msgs, key=lambda m: m[1]):
            writer.write(conns[topic], log_ns, ts.serialize_cdr(msg, msgtypes[topic]))
    return {"frames": frames, "images": images, "decided": decided, "actions": actions}


def test_live_bag_pairs_by_stamp(tmp_path):
    truth = _live_bag(tmp_path / "live")
    ep = load_bag_episode(tmp_path / "live", LIVE, EpisodeDefaults(task="stack"))
    decided = truth["decided"]
    assert (ep.task, ep.instruction, ep.suite) == ("stack", "stack", "default")
    assert ep.num_steps == len(decided) and ep.metadata["dropped_commands"] == 1
    assert ep.metadata["dropped_reasons"] == {"no /cam_high/image_raw frame within 0.05 s": 1}
    for t, k in enumerate(decided):
        np.testing.assert_array_equal(ep.image_third_person[t], truth["images"][k])
        np.testing.assert_array_equal(ep.image_wrist[t], truth["images"][k])  # bgr8 -> rgb
        np.testing.assert_allclose(ep.action[t], truth["actions"][k], atol=1e-7)
        j = round((truth["frames"][k] - truth["frames"][0]) / 10_000_000)   # nearest state
        assert ep.ee_position_m[t, 0] == pytest.approx(j * 1e-3, abs=1e-6)
        np.testing.assert_array_equal(ep.joint_positions_rad[t], np.arange(6) + j)
    assert ep.gripper_width_m[0] == pytest.approx(0.05)
    assert ep.control_rate_hz == pytest.approx(10.0, rel=1e-3)
    no_joints = load_bag_episode(tmp_path / "live", EpisodeTopics(
        LIVE.primary, LIVE.wrist, "", LIVE.ee_pose, LIVE.ee_command),
        EpisodeDefaults(task="stack"))
    assert not no_joints.joint_positions_rad.any()


def test_errors_name_what_was_found_and_the_remaps(tmp_path, tiny_target_path, capsys):
    _live_bag(tmp_path / "live")
    with pytest.raises(BagEpisodeError, match="--bag-task"):
        load_bag_episode(tmp_path / "live", LIVE)
    with pytest.raises(BagEpisodeError) as err:
        load_bag_episode(tmp_path / "live", defaults=EpisodeDefaults(task="stack"))
    text = str(err.value)
    assert "/cam_high/image_raw" in text and "--topic-primary" in text
    assert "/camera/third_person/image_raw" in text and "--topic-ee-pose" in text
    _live_bag(tmp_path / "no_cmd", with_command=False)
    code = build(tmp_path / "no_cmd", tmp_path / "db", tiny_target_path, "--bag-task", "stack",
                 "--topic-primary", LIVE.primary, "--topic-wrist", LIVE.wrist,
                 "--topic-joint-states", LIVE.joint_states, "--topic-ee-pose", LIVE.ee_pose)
    assert code == 2
    err_text = capsys.readouterr().err
    assert "/heisd/ee_command" in err_text and "--topic-ee-command" in err_text
    assert build(tmp_path / "nothing_here", tmp_path / "db2", tiny_target_path) == 2
    assert "does not exist" in capsys.readouterr().err


LIVE_OPTIONS = ("--bag-task", "stack", "--topic-primary", LIVE.primary, "--topic-wrist",
                LIVE.wrist, "--topic-joint-states", LIVE.joint_states, "--topic-ee-pose",
                LIVE.ee_pose)


def test_a_resolution_change_mid_bag_names_the_topic_and_the_step(tmp_path):
    _live_bag(tmp_path / "live", resize_from=6)  # the commands were decided on frames 0, 3, 6
    with pytest.raises(BagEpisodeError, match=r"/cam_high/image_raw changes resolution mid-bag: "
                                              r"16x12 up to step 1, 20x12 at step 2"):
        load_bag_episode(tmp_path / "live", LIVE, EpisodeDefaults(task="stack"))


def test_a_joint_state_without_the_gripper_joint_names_the_option(tmp_path):
    _live_bag(tmp_path / "live", gripper_name="joint7")
    with pytest.raises(BagEpisodeError, match=r"/piper/joint_states: no joint named 'gripper'.*"
                                              r"--gripper-joint"):
        load_bag_episode(tmp_path / "live", LIVE, EpisodeDefaults(task="stack"))
    episode = load_bag_episode(tmp_path / "live", LIVE, EpisodeDefaults(task="stack"),
                               gripper_joint="joint7")
    assert episode.gripper_width_m[0] == pytest.approx(0.05)


def test_bags_that_cannot_be_read_are_skipped_and_listed(tmp_path, tiny_target_path, capsys):
    _live_bag(tmp_path / "bags" / "a_good")
    _live_bag(tmp_path / "bags" / "b_resized", resize_from=6)
    _live_bag(tmp_path / "bags" / "c_no_gripper", gripper_name="joint7")
    assert build(tmp_path / "bags", tmp_path / "db", tiny_target_path, *LIVE_OPTIONS) == 0
    err = capsys.readouterr().err
    assert "heisd-build-db: 2 bags skipped:" in err
    assert "b_resized: " in err and "changes resolution mid-bag" in err
    assert "c_no_gripper: " in err and "no joint named 'gripper'" in err
    assert len(all_points_of(tmp_path / "db", "stack")) == 5  # the good bag's 5 steps
    code = build(tmp_path / "bags", tmp_path / "db_stop", tiny_target_path, *LIVE_OPTIONS,
                 "--stop-on-bad-bag")
    assert code == 2 and "changes resolution mid-bag" in capsys.readouterr().err


def all_points_of(db, task):
    store = open_store(StoreConfig(path=str(db), exact_search=True))
    try:
        return store.search(task, np.zeros(store.dimension) + 1.0, k=store.count(task))
    finally:
        store.close()


def test_a_folder_without_bags_says_what_it_holds(tmp_path, tiny_target_path, capsys):
    (tmp_path / "empty").mkdir()
    assert build(tmp_path / "empty", tmp_path / "db", tiny_target_path) == 2
    err = capsys.readouterr().err
    assert "no npz episodes" in err and "not a rosbag2 directory" in err
    assert "reindex" not in err
    (tmp_path / "unindexed").mkdir()
    (tmp_path / "unindexed" / "rosbag2_0.mcap").write_bytes(b"\x89MCAP0\r\n")
    assert build(tmp_path / "unindexed", tmp_path / "db", tiny_target_path) == 2
    assert "ros2 bag reindex" in capsys.readouterr().err


def test_a_step_with_a_non_finite_pose_is_left_out_and_counted(tmp_path):
    _live_bag(tmp_path / "live", nan_pose=range(8, 12))  # around frame 3 (100 ms)
    episode = load_bag_episode(tmp_path / "live", LIVE, EpisodeDefaults(task="stack"))
    assert episode.num_steps == 4 and np.isfinite(episode.ee_position_m).all()
    assert episode.metadata["dropped_reasons"] == {
        "no /cam_high/image_raw frame within 0.05 s": 1,
        "non-finite values on /piper/ee_pose": 1}


def test_metadata_that_does_not_match_the_storage_names_reindex(tmp_path):
    import yaml

    _live_bag(tmp_path / "live")
    meta_file = tmp_path / "live" / "metadata.yaml"
    meta = yaml.safe_load(meta_file.read_text())
    for entry in meta["rosbag2_bagfile_information"]["topics_with_message_count"]:
        if entry["topic_metadata"]["name"] == LIVE.primary:
            entry["topic_metadata"]["name"] = "/cam_renamed"
    meta_file.write_text(yaml.safe_dump(meta))
    topics = EpisodeTopics("/cam_renamed", LIVE.wrist, LIVE.joint_states, LIVE.ee_pose,
                           LIVE.ee_command)
    with pytest.raises(BagEpisodeError, match=r"metadata.yaml does not match the storage file "
                                              r"\(it lists 30 messages on /cam_renamed.*reindex"):
        load_bag_episode(tmp_path / "live", topics, EpisodeDefaults(task="stack"))
