"""Models: the target-VLA interface, the shipped small VLA, adapters and the draft head."""
