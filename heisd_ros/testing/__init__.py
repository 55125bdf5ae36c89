"""Helpers for tests and measurement tools that run ROS 2 graphs on this machine."""
