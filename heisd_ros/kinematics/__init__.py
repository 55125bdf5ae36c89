"""Kinematics: the kinematic router (curvature radius, displacement, fused metric)."""
