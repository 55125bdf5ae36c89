"""Data: episodes, the compact training format and rosbag2 I/O."""
