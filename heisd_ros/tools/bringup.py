r"""heisd-bringup: the launch file's graph in one process, without the ``launch`` package.

Starts the same nodes as ``launch/piper_heisd.launch.py`` (``heisd_ros.nodes.graph``), from
the same ``config/*.yaml`` and with the same argument -> parameter mapping and remappings, as
ROS 2 composition: all nodes in this process on one multi-threaded executor. rviz2 is a
separate program; start it yourself with ``rviz2 -d config/heisd.rviz``.

Examples:
    heisd-bringup                                   # sim graph, default task, heisd
    heisd-bringup --sim false --can-port can0 --model small_vla.safetensors --db heisd_db
    heisd-bringup --task stack_blue_on_red --method router_skip --threads 6
    heisd-bringup --dry-run                         # print the nodes and parameters, exit
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from pathlib import Path

from heisd_ros.nodes.graph import (
    ARGUMENT_HELP,
    LAUNCH_ARGUMENTS,
    NodeSpec,
    config_dir,
    launch_overrides,
    nodes_for,
    parse_bool,
)


def node_plan(arguments: dict[str, str], configs: Path | None = None) -> list[dict]:
    """Per node: name, class, params file, overrides and remappings (what will be started)."""
    configs = configs or config_dir()
    overrides = launch_overrides(arguments)
    sim = parse_bool(arguments.get("sim", LAUNCH_ARGUMENTS["sim"]), "sim")
    return [{"spec": spec, "params_file": str(configs / spec.config),
             "overrides": overrides.get(spec.name, {}),
             "remappings": list(spec.remappings)} for spec in nodes_for(sim)]


def ros_arguments(plan: list[dict]) -> list[str]:
    """``--ros-args`` for the context: every params file, node-scoped remappings."""
    args = ["--ros-args"]
    for item in plan:
        args += ["--params-file", item["params_file"]]
        for src, dst in item["remappings"]:
            args += ["-r", f"{item['spec'].name}:{src}:={dst}"]
    return args


def build_node(spec: NodeSpec, overrides: dict[str, str], context):
    """Instantiate one node of the plan (its class from the table) in ``context``."""
    from rclpy.parameter import Parameter

    cls = getattr(importlib.import_module(spec.module), spec.class_name)
    # Every parameter a launch argument sets is a string (paths, names).
    params = [Parameter(name, value=str(value)) for name, value in overrides.items()]
    return cls(spec.name, context=context, parameter_overrides=params)


def parse_args(argv=None) -> argparse.Namespace:
    """Command line of ``heisd-bringup`` (the launch arguments, same names and defaults)."""
    parser = argparse.ArgumentParser(prog="heisd-bringup", description=__doc__.split("\n")[0])
    for name, default in LAUNCH_ARGUMENTS.items():
        if name != "rviz":
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=default,
                                help=ARGUMENT_HELP[name].replace("%", "%%"))
    parser.add_argument("--threads", type=int, default=4, help="executor threads")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Entry point of ``heisd-bringup``."""
    args = parse_args(argv)
    arguments = {name: getattr(args, name) for name in LAUNCH_ARGUMENTS if name != "rviz"}
    try:
        plan = node_plan(arguments)
    except ValueError as exc:  # a bad method or sim value: say so, start nothing
        print(f"heisd-bringup: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for item in plan:
            print(f"{item['spec'].name}: {item['spec'].module}.{item['spec'].class_name} "
                  f"params={item['params_file']} overrides={item['overrides']} "
                  f"remappings={item['remappings']}")
        return 0
    import rclpy
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    nodes = []
    try:
        with rclpy.init(args=ros_arguments(plan),
                        signal_handler_options=SignalHandlerOptions.NO) as init:
            context = init.context
            executor = MultiThreadedExecutor(num_threads=args.threads, context=context)
            try:
                for item in plan:
                    nodes.append(build_node(item["spec"], item["overrides"], context))
                    executor.add_node(nodes[-1])
                executor.spin()
            finally:
                executor.shutdown()
                for node in reversed(nodes):
                    node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
