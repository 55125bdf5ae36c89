"""ROS 2 nodes: thin adapters between messages and the library (rclpy imported here only)."""
