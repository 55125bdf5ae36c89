"""Decision latency priced from counters: profiles, the cost function, the device timeline.

A decision's latency on a target machine (OpenVLA-7B on a GPU, this CPU, a robot computer) is
computed from what the decision did (vision, prefill and its tokens, verify / decode forwards
and their tree sizes, draft-head forwards, retrievals, a check behind holding the device),
priced by a :class:`LatencyProfile`. Real-time evaluation at a profile is deterministic; the
projection of measured counters to a GPU uses the same cost function. Pure Python + numpy.
"""

from heisd_ros.latency.counters import DecisionCounters
from heisd_ros.latency.pricing import DeviceTimeline, Priced, price
from heisd_ros.latency.profile import LatencyProfile, load_profile, shipped_profiles

__all__ = ["DecisionCounters", "DeviceTimeline", "LatencyProfile", "Priced", "load_profile",
           "price", "shipped_profiles"]
