"""Declare a config dataclass's fields as read-only ROS parameters and build it from them.

Every node keeps its settings in a self-checking dataclass (STYLE #4). This helper turns the
dataclass into declared ROS parameters (name ``<prefix>.<field>``, default from the field,
description from the class docstring's ``Attributes:`` section) and fills the dataclass back
from whatever the YAML (``<node>: ros__parameters:``) or the command line set::

    store_config = dataclass_from_parameters(node, StoreConfig, "store")

Parameters are read once at start, so they are declared read-only: a ``ros2 param set`` that
would have no effect is refused instead of silently ignored.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException
from rclpy.node import Node

C = TypeVar("C")
_SCALARS = (bool, int, float, str)
_ATTR_RE = re.compile(r"^(\s*)([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_]\w*)*)\s*:\s*(.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the Google-style ``Attributes:`` section of ``cls``'s docstring.

    A line ``a, b: text`` documents both ``a`` and ``b``; deeper-indented lines continue it.
    """
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return docs
    names: list[str] = []
    indent = None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        match = _ATTR_RE.match(line)
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break  # the section ended
        if depth == indent and match:
            names = [n.strip() for n in match.group(2).split(",")]
            for name in names:
                docs[name] = match.group(3).strip()
        else:
            for name in names:
                docs[name] = f"{docs[name]} {line.strip()}"
    return docs


def _kind(hint: Any) -> type | None:
    """The scalar type of a field (``str``, ``int``, ...) or None when ROS cannot hold it."""
    if hint in _SCALARS:
        return hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (tuple, list) and args and args[0] in _SCALARS[1:]:
        return origin  # homogeneous sequence: a ROS array parameter
    return None


def declare_dataclass_parameters(node: Node, cls: type, prefix: str = "", *,
                                 defaults: Mapping[str, Any] | None = None,
                                 skip: Collection[str] = (),
                                 descriptions: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Declare one read-only parameter per field of ``cls``; return the values by field name.

    Args:
        node: the node that owns the parameters.
        cls: a dataclass whose fields have scalar (bool, int, float, str) or
            homogeneous tuple/list types and defaults.
        prefix: parameter namespace, e.g. "store" gives ``store.path``; "" for none.
        defaults: per-field defaults that replace the dataclass's (a node's own choice).
        skip: fields not exposed as parameters (they keep the dataclass default).
        descriptions: per-field descriptions that replace the docstring's.

    Raises:
        ValueError: naming every parameter set to a value of the wrong type; the others
            are still declared.
    """
    hints = typing.get_type_hints(cls)
    docs = {**attribute_docs(cls), **(descriptions or {})}
    defaults = defaults or {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field in dataclasses.fields(cls):
        if field.name in skip or not field.init:
            continue
        kind = _kind(hints[field.name])
        if kind is None:
            raise TypeError(f"{cls.__name__}.{field.name}: type {hints[field.name]} cannot be "
                            f"a ROS parameter; pass it in skip")
        name = f"{prefix}.{field.name}" if prefix else field.name
        if field.name in defaults:
            default = defaults[field.name]
        elif field.default is not dataclasses.MISSING:
            default = field.default
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: no default; give one in defaults")
        if kind in (tuple, list):
            default = list(default)
        # Floats are dynamically typed so that YAML's `timeout_s: 5` (an int) is accepted;
        # the value is checked and converted below instead.
        descriptor = ParameterDescriptor(description=docs.get(field.name, ""), read_only=True,
                                         dynamic_typing=kind is float)
        try:
            value = node.declare_parameter(name, default, descriptor).value
        except InvalidParameterTypeException as exc:
            problems.append(f"{name}: {exc}")
            value = node.declare_parameter(name, default, descriptor, ignore_override=True).value
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append(f"{name}: expected a number, got {value!r}")
                value = default
            value = float(value)
        elif kind in (tuple, list):
            value = kind(value)
        values[field.name] = value
    if problems:
        raise ValueError("invalid parameters: " + "; ".join(problems))
    return values


def dataclass_from_parameters(node: Node, cls: type[C], prefix: str = "", **kwargs: Any) -> C:
    """Declare ``cls``'s parameters (see :func:`declare_dataclass_parameters`) and build it.

    Raises:
        ValueError: a parameter has the wrong type, or the dataclass rejects a value (its
            message names the field; the prefix is added so the ROS parameter is findable).
    """
    values = declare_dataclass_parameters(node, cls, prefix, **kwargs)
    try:
        return cls(**values)
    except ValueError as exc:
        where = f"'{prefix}.*' parameters" if prefix else "parameters"
        raise ValueError(f"invalid {where}: {exc}") from exc
