"""Reading a Hugging Face safetensors checkpoint directory, checked before any tensor moves.

Layouts: sharded (``model.safetensors.index.json`` whose ``weight_map`` names a shard per
tensor, e.g. ``model-00001-of-00003.safetensors``) or one ``model.safetensors``. Names and
shapes come from the shard headers, so a wrong checkpoint fails in milliseconds, before
gigabytes are read.
"""

from __future__ import annotations

import json
from pathlib import Path

from heisd_ros.models.openvla.keymap import KeyPlan

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_SHOWN = 8   # names listed in an error message


def _listing(names) -> str:
    names = sorted(names)
    more = f" ... ({len(names)} in all)" if len(names) > _SHOWN else ""
    return f"{names[:_SHOWN]}{more}"


def _header(shard: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(shard), framework="pt") as handle:
            return {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{shard}: not a readable safetensors file ({err})") from err


def index_checkpoint(directory: Path) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    """(tensor name -> shard file, tensor name -> shape) of a checkpoint directory."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{index}: not a safetensors index with a 'weight_map' "
                             f"({err})") from err
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{directory}: missing shard file(s) {missing} named in "
                                    f"{INDEX_FILE}; the download is incomplete")
        locations = {name: directory / shard for name, shard in weight_map.items()}
    elif (directory / SINGLE_FILE).is_file():
        shards, locations = [SINGLE_FILE], None
    else:
        raise FileNotFoundError(f"{directory}: no {INDEX_FILE} or {SINGLE_FILE}; found "
                                f"{sorted(p.name for p in directory.iterdir())[:20]}")
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        header = _header(directory / shard)
        if locations is None:
            locations = {name: directory / shard for name in header}
        shapes.update({k: v for k, v in header.items() if locations.get(k) == directory / shard})
    absent = [n for n in locations if n not in shapes]
    if absent:
        raise ValueError(f"{directory}: {INDEX_FILE} lists tensors that are not in their shard: "
                         f"{_listing(absent)}")
    return locations, shapes


def check_against_plan(directory: Path, shapes: dict[str, tuple[int, ...]], plan: KeyPlan,
                       vocab_names: tuple[str, ...] = ()) -> None:
    """Raise naming every missing, unexpected or mis-shaped tensor.

    ``vocab_names`` are the tensors whose first dimension is the vocabulary size; a mismatch
    there is reported as a vocabulary-size problem.
    """
    missing = set(plan.shapes) - set(shapes)
    unexpected = set(shapes) - set(plan.shapes)
    if missing or unexpected:
        raise ValueError(f"{directory}: tensor names do not match OpenVLA's: missing "
                         f"{_listing(missing)}, unexpected {_listing(unexpected)}")
    for name in (n for n in vocab_names if n in plan.shapes):
        if shapes[name] != plan.shapes[name]:
            raise ValueError(f"{directory}: vocabulary size mismatch: tensor '{name}' has shape "
                             f"{shapes[name]}, config.json (text_config.vocab_size) needs "
                             f"{plan.shapes[name]}")
    wrong = {n: (shapes[n], plan.shapes[n]) for n in plan.shapes if shapes[n] != plan.shapes[n]}
    if wrong:
        first = sorted(wrong)[:_SHOWN]
        raise ValueError(f"{directory}: {len(wrong)} tensor(s) with the wrong shape for this "
                         "config (found, expected): "
                         + ", ".join(f"{n} {wrong[n][0]} vs {wrong[n][1]}" for n in first))


def read_tensors(locations: dict[str, Path], names, device, dtype) -> dict:
    """Load ``names`` shard by shard straight onto ``device``, cast to ``dtype``."""
    import torch
    from safetensors import safe_open

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    by_shard: dict[Path, list[str]] = {}
    for name in names:
        by_shard.setdefault(locations[name], []).append(name)
    tensors = {}
    for shard, shard_names in sorted(by_shard.items()):
        with safe_open(str(shard), framework="pt", device=str(device)) as handle:
            for name in shard_names:
                tensors[name] = handle.get_tensor(name).to(dtype)
    return tensors
