"""Decoding: AR, draft trees, tree verification, acceptance rules, speculative decoders."""
