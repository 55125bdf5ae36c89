"""How the sim node's world runs; pure data (the launch table imports it without numpy)."""

from __future__ import annotations

#: "realtime": the world runs with the clock; "lockstep": one control period per command.
SIM_MODES: tuple[str, ...] = ("realtime", "lockstep")
