"""Helpers for ROS 2 interface tests: fill any generated message with random values."""

from __future__ import annotations

import array

import numpy as np
from rosidl_parser import definition as idl

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "byte": (0, 2**8 - 1),
    "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1),
    "char": (0, 2**8 - 1), "octet": (0, 2**8 - 1),
}
_NUMPY = {"float": np.float32, "double": np.float64, "int8": np.int8, "uint8": np.uint8,
          "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
          "int64": np.int64, "uint64": np.uint64, "octet": np.uint8}
_ARRAY_CODE = {"float": "f", "double": "d", "int8": "b", "uint8": "B", "int16": "h",
               "uint16": "H", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q"}


def _scalar(basic: str, rng: np.random.Generator):
    if basic == "boolean":
        return bool(rng.integers(0, 2))
    if basic in ("float", "double"):
        value = rng.normal(0.0, 1e3)
        return float(np.float32(value)) if basic == "float" else float(value)
    if basic == "octet" or basic == "byte":
        return bytes([int(rng.integers(0, 256))])
    lo, hi = _INT_RANGES[basic]
    return int(rng.integers(lo, hi, endpoint=True, dtype=np.uint64 if lo == 0 else np.int64))


def _string(rng: np.random.Generator) -> str:
    alphabet = "abcxyz ABC019_-/:.äöü°ψ→"
    return "".join(rng.choice(list(alphabet), size=int(rng.integers(0, 24))))


def _value(slot, rng: np.random.Generator):
    if isinstance(slot, idl.BasicType):
        return _scalar(slot.typename, rng)
    if isinstance(slot, idl.AbstractGenericString):
        return _string(rng)
    if isinstance(slot, idl.NamespacedType):
        module = __import__(".".join(slot.namespaces), fromlist=[slot.name])
        return fill_random(getattr(module, slot.name)(), rng)
    if isinstance(slot, idl.Array):
        values = [_value(slot.value_type, rng) for _ in range(slot.size)]
        basic = getattr(slot.value_type, "typename", None)
        return np.array(values, dtype=_NUMPY[basic]) if basic in _NUMPY else values
    if isinstance(slot, idl.AbstractSequence):
        n = int(rng.integers(0, 6))
        if isinstance(slot, idl.BoundedSequence):
            n = min(n, slot.maximum_size)
        values = [_value(slot.value_type, rng) for _ in range(n)]
        basic = getattr(slot.value_type, "typename", None)
        return array.array(_ARRAY_CODE[basic], values) if basic in _ARRAY_CODE else values
    raise TypeError(f"unhandled slot type {slot!r}")


def fill_random(msg, rng: np.random.Generator):
    """Set every field of ``msg`` (recursively) to a random valid value; return ``msg``."""
    for name, slot in zip(msg.get_fields_and_field_types(), msg.SLOT_TYPES, strict=True):
        setattr(msg, name, _value(slot, rng))
    return msg
