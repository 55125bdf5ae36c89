"""Reading a written ``.rrd`` back through Rerun's own reader (tests and ``heisd-view check``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from heisd_ros.viewer import require_rerun


def entity_rows(path: str | Path) -> dict[str, int]:
    """Rows logged per entity path of the file's first recording (static rows included)."""
    require_rerun()
    from rerun.chunk import RrdReader

    rows: Counter[str] = Counter()
    for chunk in RrdReader(Path(path)).stream().collect().stream():
        rows[str(chunk.entity_path)] += chunk.num_rows
    return dict(rows)


def column_values(path: str | Path, entity: str, column: str) -> list:
    """Every value of one component column of ``entity``, in the order of its chunks' rows.

    ``column``: e.g. ``"Scalars:scalars"``; a file written in step order reads back in it.
    """
    require_rerun()
    from rerun.chunk import RrdReader

    out: list = []
    for chunk in RrdReader(Path(path)).stream().collect().stream():
        if str(chunk.entity_path) != entity:
            continue
        batch = chunk.to_record_batch()
        if column in batch.schema.names:
            out += batch.column(column).to_pylist()
    return out
