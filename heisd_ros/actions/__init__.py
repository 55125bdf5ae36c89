"""Action tokens: OpenVLA-compatible bins, normalisation and kinematic groups."""

from heisd_ros.actions.bins import N_BINS, ActionTokenMap, bins_to_values, values_to_bins
from heisd_ros.actions.groups import ACTION_GROUPS, GRIPPER_DIM, group_of_dim, group_spans
from heisd_ros.actions.normalization import ActionCodec, ActionStats

__all__ = ["N_BINS", "ActionTokenMap", "bins_to_values", "values_to_bins", "ACTION_GROUPS",
           "GRIPPER_DIM", "group_of_dim", "group_spans", "ActionCodec", "ActionStats"]
