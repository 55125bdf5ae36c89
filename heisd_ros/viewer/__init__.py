"""Rerun views of episodes: live from a running graph, from rosbag2 bags, from ``heisd-eval``.

Rerun is an optional dependency (the ``view`` extra, installed by ``make setup``); every
module that needs it calls :func:`require_rerun`, which says in one line how to install it.
"""

from __future__ import annotations

#: The Rerun SDK this package is tested with (requirements/view.txt, setup.py's ``view``).
RERUN_REQUIREMENT = "rerun-sdk==0.41.0"


class RerunMissing(RuntimeError):
    """The Rerun SDK is not installed (the message says how to install it)."""


def require_rerun():
    """The ``rerun`` module, or :class:`RerunMissing` naming the install command."""
    try:
        import rerun
    except ImportError as err:
        raise RerunMissing(
            f"the viewer needs the Rerun SDK (Python 3.11 or newer): pip install "
            f"'{RERUN_REQUIREMENT}' (or pip install -e '.[view]', or make setup)") from err
    return rerun
