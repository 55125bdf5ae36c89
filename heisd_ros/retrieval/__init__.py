"""Retrieval: the vector-store interface, its Qdrant backends and DB building (no torch)."""
