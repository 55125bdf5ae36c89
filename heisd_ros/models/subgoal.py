"""What the subgoal pathway (``small_vla.SubgoalPathway``) predicts, in which units.

Per step, the end effector's displacement (x, y, z) to its position at each of the next
``SUBGOALS`` gripper changes of the demonstration (the grasp, then the release), in units
of ``SCALE_M`` metres, clipped to +-``CLIP``. The pathway's head outputs ``N_TARGETS``
values in this layout; ``heisd_ros.training.subgoal`` computes the targets and trains it.
"""

SUBGOALS = 2
SCALE_M = 0.1
CLIP = 4.0
N_TARGETS = 3 * SUBGOALS
