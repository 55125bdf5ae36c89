"""Logging one episode to a Rerun recording: the arm, the cameras, the path and the steps.

Entities (all positions in the robot's ``base_link`` frame, metres):

- ``robot/...``: the PIPER from :func:`heisd_ros.robot.piper_urdf.piper_urdf` (the same
  kinematics as the sim's MJCF and the driver's FK), its joints set at every step;
- ``world/ee_path``: the flange path as segments, each coloured by the kind of the step whose
  action drove it (:data:`heisd_ros.viewer.steps.KINDS`, a legend through an annotation
  context); ``world/ee_steps``: one point per step in the same colours;
- ``cameras/third_person``, ``cameras/wrist``: the frames each step was decided on (JPEG);
- ``metrics/latency_ms``, ``metrics/accepted_length``, ``metrics/router_F``,
  ``metrics/command_age_ms``: per-step scalars;
- ``steps/status``: one text line per step (its kind, router mode, F, accepted length and
  any status).

Timelines: ``step`` (the step index) and ``time`` (s since the first step logged).
A step whose check behind is pending is recoloured when its successor brings the verdict.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

from heisd_ros.viewer import require_rerun
from heisd_ros.viewer.steps import (
    KIND_IDS,
    KINDS,
    own_kind,
    resolve_behind,
    status_line,
    step_scalars,
)

#: The URDF's arm joints (``/joint_states`` names) and the gripper joint with its fingers.
ARM_JOINTS = tuple(f"joint{i}" for i in range(1, 7))
GRIPPER_JOINT = "gripper"
FINGER_JOINTS = ("finger_left", "finger_right")
ROBOT_PREFIX = "robot"
PATH_RADIUS_M = 0.003
JPEG_QUALITY = 85
#: Where the 3-D view looks from and at, in base_link (m): the arm's front right, the
#: workspace in front of the base.
EYE_POSITION_M = (0.62, -0.48, 0.42)
EYE_TARGET_M = (0.22, 0.0, 0.14)


def _urdf_file() -> Path:
    """The PIPER's URDF written from the project's kinematics (one file per process)."""
    from heisd_ros.robot.piper_urdf import piper_urdf

    path = Path(tempfile.gettempdir()) / "heisd_ros_view_piper.urdf"
    text = piper_urdf()
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def blueprint():
    """The layout: the 3-D view beside the cameras, the step scalars and the status lines."""
    import rerun.blueprint as rrb

    return rrb.Blueprint(
        rrb.Horizontal(
            rrb.Spatial3DView(name="arm and EE path", origin="/",
                              contents=["/robot/**", "/world/**", "/tf_static"],
                              eye_controls=rrb.EyeControls3D(
                                  position=EYE_POSITION_M, look_target=EYE_TARGET_M,
                                  eye_up=(0.0, 0.0, 1.0))),
            rrb.Vertical(
                rrb.Horizontal(rrb.Spatial2DView(name="third person",
                                                 origin="/cameras/third_person"),
                               rrb.Spatial2DView(name="wrist", origin="/cameras/wrist")),
                rrb.TimeSeriesView(name="latency and command age (ms)", origin="/metrics",
                                   contents=["/metrics/latency_ms", "/metrics/command_age_ms"]),
                rrb.TimeSeriesView(name="accepted length and router F", origin="/metrics",
                                   contents=["/metrics/accepted_length", "/metrics/router_F"]),
                rrb.TextLogView(name="steps", origin="/steps"),
                row_shares=[3, 2, 2, 2],
            ),
            column_shares=[3, 2],
        ),
        collapse_panels=True,
    )


class EpisodeLog:
    """Logs the steps of one episode to ``recording`` (a ``rerun.RecordingStream``).

    ``path_keep``: the newest steps drawn in the path (None: all; a live view bounds it).
    """

    def __init__(self, recording, *, path_keep: int | None = None) -> None:
        rr = require_rerun()
        import rerun.urdf as rru

        self.rr, self.recording, self.path_keep = rr, recording, path_keep
        self._tree = rru.UrdfTree.from_file_path(_urdf_file(), entity_path_prefix=ROBOT_PREFIX)
        self._tree.log_urdf_to_recording(recording)
        self._joints = {name: self._tree.get_joint_by_name(name)
                        for name in (*ARM_JOINTS, GRIPPER_JOINT, *FINGER_JOINTS)}
        base = self._tree.root_link().name
        annotation = rr.AnnotationContext([(KIND_IDS[name], label, colour)
                                           for name, label, colour in KINDS])
        for entity in ("world/ee_path", "world/ee_steps"):
            rr.log(entity, annotation, rr.CoordinateFrame(base), static=True, recording=recording)
        for name in ("latency_ms", "accepted_length", "router_F", "command_age_ms"):
            rr.log(f"metrics/{name}", rr.SeriesLines(names=name), static=True,
                   recording=recording)
        self.positions: list[np.ndarray] = []   # the current episode's path
        self.kinds: list[str] = []
        self.steps = 0                            # steps logged, all episodes
        self._first_t_s: float | None = None

    def new_episode(self, label: str) -> None:
        """Start a new path (the timelines go on); ``label`` goes to the status lines."""
        self.positions, self.kinds = [], []
        self.rr.log("steps/status", self.rr.TextLog(f"episode {label}", level="INFO"),
                    recording=self.recording)

    def step(self, t_s: float, *, joints_rad, gripper_m: float, ee_position_m,
             fields: dict | None = None, images: tuple | None = None,
             command_age_ms: float | None = None) -> str:
        """Log one step at time ``t_s`` (s); returns its kind (see :mod:`.steps`).

        ``joints_rad``: the six arm joints; ``gripper_m``: the opening; ``ee_position_m``: the
        flange in ``base_link``; ``fields``: the step's HybridStep fields (None: none known);
        ``images``: (third person, wrist) RGB arrays or None.
        """
        rr, rec = self.rr, self.recording
        index = self.steps
        self.steps += 1
        if self._first_t_s is None:
            self._first_t_s = float(t_s)
        rr.set_time("step", sequence=index, recording=rec)
        rr.set_time("time", duration=float(t_s) - self._first_t_s, recording=rec)
        if self.kinds:   # the previous step's check behind is decided by this step
            self.kinds[-1] = resolve_behind(self.kinds[-1], fields)
        kind = own_kind(fields)
        self.kinds.append(kind)
        self.positions.append(np.asarray(ee_position_m, dtype=np.float64).reshape(3))
        self._log_joints(joints_rad, gripper_m)
        self._log_path()
        if images is not None:
            for name, image in zip(("third_person", "wrist"), images, strict=True):
                if image is not None:
                    rr.log(f"cameras/{name}", rr.Image(np.asarray(image)).compress(JPEG_QUALITY),
                           recording=rec)
        scalars = step_scalars(fields)
        if command_age_ms is not None:
            scalars["command_age_ms"] = float(command_age_ms)
        for name, value in scalars.items():
            if not math.isnan(value):
                rr.log(f"metrics/{name}", rr.Scalars(value), recording=rec)
        level = "WARN" if fields and fields.get("status") else "INFO"
        rr.log("steps/status", rr.TextLog(status_line(index, kind, fields), level=level),
               recording=rec)
        return kind

    def _log_joints(self, joints_rad, gripper_m: float) -> None:
        values = dict(zip(ARM_JOINTS, np.asarray(joints_rad, dtype=np.float64).reshape(6),
                          strict=True))
        opening = float(np.clip(gripper_m, 0.0, 0.07))
        values[GRIPPER_JOINT] = opening
        values.update({name: opening / 2 for name in FINGER_JOINTS})
        for name, value in values.items():
            self.rr.log(f"{ROBOT_PREFIX}/joints/{name}",
                        self._joints[name].compute_transform(float(value), clamp=False),
                        recording=self.recording)

    def _log_path(self) -> None:
        rr, rec = self.rr, self.recording
        start = 0 if self.path_keep is None else max(0, len(self.kinds) - self.path_keep)
        points = np.asarray(self.positions[start:])
        ids = [KIND_IDS[k] for k in self.kinds[start:]]
        rr.log("world/ee_steps", rr.Points3D(points, class_ids=ids, radii=PATH_RADIUS_M * 1.6,
                                         show_labels=False),
               recording=rec)
        if len(points) > 1:   # segment i: from step i's position to step i + 1's
            rr.log("world/ee_path",
                   rr.LineStrips3D(np.stack([points[:-1], points[1:]], axis=1),
                                   class_ids=ids[:-1], radii=PATH_RADIUS_M,
                                   show_labels=False), recording=rec)
