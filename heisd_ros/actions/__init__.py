"""Action tokens: OpenVLA-compatible bins, normalisation and kinematic groups."""
