"""QoS profiles shared by the nodes that publish and subscribe a topic."""

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

#: ``/heisd/episode_status``: latched (the last status reaches a late subscriber) and reliable.
STATUS_QOS = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                        reliability=ReliabilityPolicy.RELIABLE)
