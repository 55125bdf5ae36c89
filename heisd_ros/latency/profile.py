"""Latency profiles: what each kind of work costs on one machine, with where each figure is from.

A profile prices the counters of one decision (:mod:`heisd_ros.latency.counters`):

- ``vision_ms`` per encoded observation (on the device);
- the prefill, the decision's first target forward: ``prefill_base_ms + prefill_per_token_ms
  * tokens``, tokens = the prompt's context tokens (``prompt_tokens`` when the profile is of
  another model than the one decoding, e.g. OpenVLA-7B's 280) + the draft tree it carries;
- every later target forward (decode or tree verification): ``forward_base_ms +
  forward_per_token_ms * (tokens - 1)``: a memory-bound GPU pays about one weight read for a
  small tree, a CPU pays per token;
- ``drafter_forward_ms`` per draft-head forward (device) and ``draft_call_ms`` per draft
  proposal (host: building the tree);
- ``retrieval_ms`` per vector-DB query (host CPU) and ``overhead_ms`` per decision (host: image
  conversion, pre/post-processing, transfers, Python).

A check behind (``heisd_behind``) is one forward over the prompt and the 7 executed tokens,
priced as a prefill; a ``deadline`` check (``heisd_deadline``) continues its step's own cache
over the unverified tokens, priced as a later forward. ``check_occupies`` says what it holds
while it runs: ``"device"`` (a GPU: the next decision's device work waits for it) or
``"core"`` (a CPU with a spare core: only a decision that needs its verdict waits).

Profiles are YAML files (``heisd_ros/latency/profiles/<name>.yaml``, or any path) holding
these fields plus ``sources`` (field -> where the figure comes from) and ``assumptions``.
``fixed:<ms>`` is a profile where every decision takes exactly ``<ms>`` (latency sweeps).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

#: Folder of the shipped profiles.
PROFILE_DIR = Path(__file__).with_name("profiles")
#: What a check behind can hold while it runs.
CHECK_OCCUPIES = ("device", "core")

_COSTS = ("vision_ms", "prefill_base_ms", "prefill_per_token_ms", "forward_base_ms",
          "forward_per_token_ms", "drafter_forward_ms", "draft_call_ms", "retrieval_ms",
          "overhead_ms")


@dataclass(frozen=True)
class LatencyProfile:
    """Component costs of one machine and model, in ms (see the module docstring).

    Attributes:
        name: the profile's name (reports quote it).
        description: one line on the machine and model it describes.
        prompt_tokens: context tokens of the profiled model's prefill; None = the decoding
            model's own counted tokens (a profile fitted on the machine that decodes).
        check_occupies: ``"device"`` or ``"core"`` (see the module docstring).
        sources: field name -> where its figure comes from.
        assumptions: every assumption the figures rest on, in words.
    """

    name: str
    vision_ms: float = 0.0
    prefill_base_ms: float = 0.0
    prefill_per_token_ms: float = 0.0
    forward_base_ms: float = 0.0
    forward_per_token_ms: float = 0.0
    drafter_forward_ms: float = 0.0
    draft_call_ms: float = 0.0
    retrieval_ms: float = 0.0
    overhead_ms: float = 0.0
    prompt_tokens: int | None = None
    check_occupies: str = "device"
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        for name in _COSTS:
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name}: expected a finite cost >= 0 ms, got {value!r}")
        if self.prompt_tokens is not None and (isinstance(self.prompt_tokens, bool)
                                               or not isinstance(self.prompt_tokens, int)
                                               or self.prompt_tokens < 1):
            raise ValueError(f"prompt_tokens: expected an integer >= 1 or null, got "
                             f"{self.prompt_tokens!r}")
        if self.check_occupies not in CHECK_OCCUPIES:
            raise ValueError(f"check_occupies: expected one of {CHECK_OCCUPIES}, got "
                             f"{self.check_occupies!r}")
        unknown = sorted(set(self.sources) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"sources: {unknown} are not profile fields")
        object.__setattr__(self, "assumptions", tuple(str(a) for a in self.assumptions))

    @classmethod
    def fixed(cls, ms: float) -> LatencyProfile:
        """Every decision takes exactly ``ms`` (charged as overhead); checks cost nothing."""
        return cls(name=f"fixed:{ms:g}", overhead_ms=float(ms),
                   description=f"a fixed decision latency of {ms:g} ms",
                   assumptions=("every decision takes the same time, whatever it computes",))

    def prefill_ms(self, context_tokens: int, tree_tokens: int) -> float:
        """One prefill over the prompt's context tokens and ``tree_tokens`` drafted ones."""
        context = self.prompt_tokens if self.prompt_tokens is not None else context_tokens
        return self.prefill_base_ms + self.prefill_per_token_ms * (context + tree_tokens)

    def forward_ms(self, context_tokens: int, tree_tokens: int) -> float:
        """One decode / verify forward (usually 1 pending token + a tree)."""
        return self.forward_base_ms + self.forward_per_token_ms * max(
            0, context_tokens + tree_tokens - 1)

    def to_dict(self) -> dict:
        """Plain types, in field order (what :func:`save_profile` writes)."""
        out = asdict(self)
        out["assumptions"] = list(self.assumptions)
        return out

    @classmethod
    def from_dict(cls, data: dict, where: str = "profile") -> LatencyProfile:
        """Build from a mapping; ValueError naming unknown keys or a bad value."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping of profile fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown}; valid: {sorted(known)}")
        values = dict(data)
        for name in _COSTS:
            if isinstance(values.get(name), int) and not isinstance(values[name], bool):
                values[name] = float(values[name])
        values["sources"] = dict(values.get("sources") or {})
        values["assumptions"] = tuple(values.get("assumptions") or ())
        try:
            return cls(**values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from err


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(spec: str | Path | LatencyProfile) -> LatencyProfile:
    """A profile by shipped name, ``fixed:<ms>``, or YAML path.

    Raises:
        ValueError: an unknown name (listing the valid ones), an unreadable file or a bad
            field.
    """
    if isinstance(spec, LatencyProfile):
        return spec
    text = str(spec)
    if text.startswith("fixed:"):
        try:
            ms = float(text.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"latency profile {text!r}: expected fixed:<ms>, e.g. "
                             f"fixed:100") from None
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"latency profile {text!r}: expected a latency >= 0 ms")
        return LatencyProfile.fixed(ms)
    path = PROFILE_DIR / f"{text}.yaml"
    if not path.is_file():
        path = Path(text)
    if not path.is_file():
        raise ValueError(f"latency profile {text!r}: neither a shipped profile "
                         f"({', '.join(shipped_profiles())}), fixed:<ms>, nor a file")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"latency profile {path}: cannot read it: {err}") from err
    return LatencyProfile.from_dict(data, where=f"latency profile {path}")


def save_profile(profile: LatencyProfile, path: str | Path, header: str = "") -> Path:
    """Write ``profile`` as YAML (``header`` lines become comments at the top)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comments + yaml.safe_dump(profile.to_dict(), sort_keys=False, width=100))
    return path
