"""Settings of the policy node itself: its top-level parameters.

``input.*`` and ``model.*`` have their own dataclasses, in :mod:`heisd_ros.nodes.policy_inputs`
and :mod:`heisd_ros.nodes.policy_decoders`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from heisd_ros.nodes.graph import check_method
from heisd_ros.nodes.retrieval_client import DEFAULT_SERVICE


@dataclass
class PolicyNodeConfig:
    """Settings of the policy node (inputs have ``input.*``, models ``model.*``).

    Attributes:
        method: decoder, a name of ``heisd_ros.decoding.methods.METHODS`` ("heisd", the
            full method, by default). Router methods without router statistics
            (``model.db_dir``) run as drafter SD.
        image_transport: "raw" (sensor_msgs/Image) or "compressed" (CompressedImage on
            ``<topic>/compressed``).
        third_person_topic, wrist_topic: camera topics.
        follow_episode_status: take the instruction and task from /heisd/episode_status
            while the ``instruction`` parameter is empty.
        frame_id: frame of the commands, the path and the markers.
        retrieval_service: Retrieve service of the retrieval node.
        min_period_s: least time between two steps, s (0 = one step per new
            paired third-person frame).
        path_length: poses kept in /heisd/ee_path.
        marker_keep: steps whose markers stay visible.
        warn_throttle_s: one warning per refusal kind at most this often, s.
        diagnostics_period_s: period of /diagnostics, s.
        latency_window: steps in the latency statistics.
        max_command_age_s: a command whose camera frames are older than this when the decoder
            is done is not sent (the step holds and says why), s. The input gate checks the
            frames' age when a step starts (``input.max_age_s``); decoding adds to it. The
            driver has its own limit on the command's stamp.
        input_timeout_s: with no command and no refusal for this long, the node names the
            inputs it waits for (silent camera, robot state, instruction), s.
        episode_jump_m: a robot state whose EE position lies farther than this from the
            previous one starts a new episode (the arm was reset or moved by hand), m;
            0 = off.
        decode_worker: decode in a process of its own (``heisd_ros.nodes.decode_worker``),
            so the executor's work on robot states and frames cannot starve the decoder of
            the GIL; False decodes in the executor's step thread (debugging, tests that
            look inside the decoder).
    """

    method: str = "heisd"
    image_transport: str = "raw"
    third_person_topic: str = "/camera/third_person/image_raw"
    wrist_topic: str = "/camera/wrist/image_raw"
    follow_episode_status: bool = True
    frame_id: str = "base_link"
    retrieval_service: str = DEFAULT_SERVICE
    min_period_s: float = 0.0
    path_length: int = 500
    marker_keep: int = 50
    warn_throttle_s: float = 2.0
    diagnostics_period_s: float = 1.0
    latency_window: int = 500
    max_command_age_s: float = 0.4
    input_timeout_s: float = 1.0
    episode_jump_m: float = 0.1
    decode_worker: bool = True

    def __post_init__(self) -> None:
        if not self.method:
            raise ValueError("method: expected a decoder name, got ''")
        check_method(self.method)
        if self.image_transport not in ("raw", "compressed"):
            raise ValueError(f"image_transport: expected 'raw' or 'compressed', got "
                             f"{self.image_transport!r}")
        for name in ("min_period_s", "warn_throttle_s", "episode_jump_m"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}: expected >= 0 s, got {getattr(self, name)}")
        for name in ("max_command_age_s", "input_timeout_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name}: expected a finite value > 0 s, "
                                 f"got {getattr(self, name)}")
        if not self.diagnostics_period_s > 0:
            raise ValueError(f"diagnostics_period_s: expected > 0, "
                             f"got {self.diagnostics_period_s}")
        for name in ("path_length", "marker_keep", "latency_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
