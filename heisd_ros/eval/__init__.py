"""Offline evaluation: closed-loop metrics, method registry, projection, reports, bag replay."""
