"""Simulation: the MuJoCo PIPER tabletop, task suites and scripted experts."""
