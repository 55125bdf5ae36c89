"""Geometry: rotation conventions (rpy, matrices, rotation vectors, quaternions); numpy only."""
