"""Calibration: offline thresholds for the router and the adaptive verify-skip."""
