"""OpenVLA's gripper value reaches EECommand as OpenVLA's own evaluation would act on it.

OpenVLA predicts the gripper un-normalised in Open-X's convention (1 = open); its robot
evaluation maps [0, 1] to [-1, +1] and takes the sign (``normalize_gripper_action`` with
``binarize=True``: +1 = open). Written here from that rule, independently of the codec, for
every gripper bin.
"""

from __future__ import annotations

import numpy as np

from test.ros_env import require_ros

_, hmsg, _ = require_ros()

from builtin_interfaces.msg import Time  # noqa: E402

from heisd_ros.actions.bins import bins_to_values  # noqa: E402
from heisd_ros.actions.normalization import ActionStats  # noqa: E402
from heisd_ros.models.openvla.statistics import OpenVLACodec  # noqa: E402
from heisd_ros.nodes.policy_decoders import DecodedStep  # noqa: E402
from heisd_ros.nodes.policy_messages import command_msg  # noqa: E402
from heisd_ros.robot.base import CommandSource  # noqa: E402
from test.openvla_fixtures import ACTION  # noqa: E402

EECommand = hmsg.EECommand


def openvla_opens(model_value: float) -> bool:
    """OpenVLA's robot_utils: y = 2 * (x - 0) / (1 - 0) - 1, binarised by sign; +1 = open."""
    return np.sign(2.0 * model_value - 1.0) > 0


def test_every_gripper_bin_commands_what_openvla_would():
    codec = OpenVLACodec(ActionStats(q01=ACTION["q01"], q99=ACTION["q99"], mask=ACTION["mask"]))
    opened = closed = 0
    for gripper_bin in range(256):
        bins = np.array([128] * 6 + [gripper_bin])
        model_value = float(bins_to_values(bins)[6])   # the gripper is not un-normalised
        action = codec.decode(bins)
        cmd = command_msg(DecodedStep(action, bins, CommandSource.AR, True), 0, Time(),
                          "base_link")
        want = EECommand.GRIPPER_OPEN if openvla_opens(model_value) else EECommand.GRIPPER_CLOSED
        assert cmd.gripper == want, (gripper_bin, model_value, action[6])
        opened += want == EECommand.GRIPPER_OPEN
        closed += want == EECommand.GRIPPER_CLOSED
    assert opened and closed  # both sides of the threshold were seen


def test_a_model_trained_on_one_means_closed_keeps_its_convention():
    codec = OpenVLACodec(ActionStats(q01=ACTION["q01"], q99=ACTION["q99"], mask=ACTION["mask"]),
                         gripper_open_is_one=False)
    high = codec.decode(np.array([128] * 6 + [255]))
    assert high[6] == 1.0  # 1 = closed as trained: a closed command
