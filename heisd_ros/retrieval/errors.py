"""Retrieval status codes and the store's exceptions, each carrying the status it maps to.

The numbers of :class:`RetrievalStatus` equal the constants of ``srv/Retrieve.srv`` so the
retrieval node copies them into the response unchanged. Every exception raised by the store
layer is a :class:`StoreError` with a ``status`` attribute; the serving layer turns it into
``(status, reason)`` without guessing.
"""

from __future__ import annotations

import enum


class RetrievalStatus(enum.IntEnum):
    """Outcome of one retrieval request (same numbers as ``Retrieve.srv``)."""

    OK = 0
    EMPTY = 1  # no collection for this task, or it holds no points
    DEADLINE_EXCEEDED = 2
    BAD_REQUEST = 3  # e.g. the embedding dimension differs from the DB's
    ERROR = 4  # backend failure (DB unreachable, corrupt payload, ...)


class StoreError(Exception):
    """Base of the store's errors; ``status`` says how the serving layer reports it."""

    status: RetrievalStatus = RetrievalStatus.ERROR


class MissingDatabaseError(StoreError, ValueError):
    """The DB path (or server) named in the config does not hold a HeiSD database."""

    status = RetrievalStatus.ERROR


class MetadataMismatchError(StoreError, ValueError):
    """The DB's stored metadata (dimension, model fingerprint) differs from the caller's."""

    status = RetrievalStatus.ERROR


class MissingCollectionError(StoreError, LookupError):
    """No collection (or shard) exists for the requested task."""

    status = RetrievalStatus.EMPTY


class DimensionMismatchError(StoreError, ValueError):
    """A query or upserted vector has a different dimension than the DB."""

    status = RetrievalStatus.BAD_REQUEST


class BadQueryError(StoreError, ValueError):
    """A request that cannot be answered as given (non-finite vector, k < 1, ...)."""

    status = RetrievalStatus.BAD_REQUEST


class BackendError(StoreError, RuntimeError):
    """The vector-DB backend failed (I/O, server unreachable, timeout, corrupt data)."""

    status = RetrievalStatus.ERROR
