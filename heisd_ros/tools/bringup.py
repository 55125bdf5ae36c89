r"""heisd-bringup: the launch file's graph in one process, without the ``launch`` package.

Starts the same nodes as ``launch/piper_heisd.launch.py`` (``heisd_ros.nodes.graph``), from
the same ``config/*.yaml`` and with the same argument -> parameter mapping and remappings, as
ROS 2 composition: all nodes in this process on one multi-threaded executor. rviz2 is a
separate program; start it yourself with ``rviz2 -d config/heisd.rviz``. So is
robot_state_publisher, which the launch adds when installed: heisd-bringup says in one line
that it does not start it (no arm model in rviz2).

Its environment is the launch's (``heisd_ros.nodes.graph_env``): before ``rclpy.init`` it
sets ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` (``--discovery-range`` widens it) and, with
``--security true --keystore DIR``, the SROS2 variables; all its nodes share one process and
so one enclave, ``<enclave_root>/heisd_bringup``.

It stops like the launch (``heisd_ros.nodes.graph``): Ctrl-C or SIGTERM stops every node and
exits 0 (``heisd_ros.nodes._spin``: no traceback, a second signal changes nothing); when a
node dies (its constructor or one of its callbacks raises) every node is stopped and the
program exits 1, the reason on the last line of stderr.

Examples:
    heisd-bringup                                   # sim graph, default task, heisd
    heisd-bringup --sim false --can-port can0 --model small_vla.safetensors --db heisd_db
    heisd-bringup --task stack_blue_on_red --method router_skip --threads 6
    heisd-bringup --auto-reset false                # one sim episode per ~/reset call
    heisd-bringup --dry-run                         # print the nodes and parameters, exit
    heisd-bringup --discovery-range SUBNET          # reachable from the local network
    heisd-bringup --sim false --security true --keystore /etc/heisd/keystore   # SROS2
    heisd-bringup --model-type openvla --checkpoint ckpt/openvla-7b-ft --unnorm-key KEY \
        --drafter draft_head_openvla.safetensors --db db_openvla   # OpenVLA on the GPU
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from heisd_ros.nodes.graph import (
    ARGUMENT_HELP,
    LAUNCH_ARGUMENTS,
    NodeSpec,
    config_dir,
    launch_overrides,
    nodes_for,
    parse_bool,
    stop_reason,
)
from heisd_ros.nodes.graph_env import BRINGUP_ENCLAVE, enclave_arguments, process_environment
from heisd_ros.nodes.robot_description import bringup_skip_line


def node_plan(arguments: dict[str, str], configs: Path | None = None) -> list[dict]:
    """Per node: name, class, params file, overrides and remappings (what will be started)."""
    configs = configs or config_dir()
    sim = parse_bool(arguments.get("sim", LAUNCH_ARGUMENTS["sim"]), "sim")
    overrides = launch_overrides(arguments, sim)
    return [{"spec": spec, "params_file": str(configs / spec.config),
             "overrides": overrides.get(spec.name, {}),
             "remappings": list(spec.remappings)} for spec in nodes_for(sim)]


def ros_arguments(plan: list[dict], enclave: list[str] = ()) -> list[str]:
    """``--ros-args`` for the context: every params file, node-scoped remappings, the enclave.

    ``enclave``: :func:`heisd_ros.nodes.graph_env.enclave_arguments` ([] without security).
    """
    args = ["--ros-args"]
    for item in plan:
        args += ["--params-file", item["params_file"]]
        for src, dst in item["remappings"]:
            args += ["-r", f"{item['spec'].name}:{src}:={dst}"]
    return [*args, *enclave[1:]]  # enclave[0] is its own "--ros-args"


def process_settings(arguments: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(environment, enclave arguments) of this process, from the launch arguments.

    Raises:
        ValueError: a bad discovery or security argument.
    """
    return process_environment(arguments), enclave_arguments(arguments, BRINGUP_ENCLAVE)


def build_node(spec: NodeSpec, overrides: dict[str, str | bool], context):
    """Instantiate one node of the plan (its class from the table) in ``context``."""
    from rclpy.parameter import Parameter

    cls = getattr(importlib.import_module(spec.module), spec.class_name)
    # Launch arguments set strings (paths, names) and bools (graph.BOOL_ARGUMENTS).
    params = [Parameter(name, value=value) for name, value in overrides.items()]
    return cls(spec.name, context=context, parameter_overrides=params)


def failed_node(exc: BaseException, nodes) -> str:
    """The name of the node whose method raised ``exc`` (innermost frame with it as ``self``).

    A callback's exception reaches the executor without the node it belongs to; its
    traceback still has it. "a node" if none is found.
    """
    frames = [tb.tb_frame for tb in _tracebacks(exc)]
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        if any(owner is node for node in nodes):
            return owner.get_name()
    return "a node"


def _tracebacks(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


def run(plan: list[dict], threads: int, env: dict[str, str] | None = None,
        enclave: list[str] = ()) -> NoReturn:
    """Start the plan's nodes in this process, spin them until a signal or a failure, exit.

    ``env`` goes into this process's environment before ``rclpy.init`` (the middleware reads
    discovery and security settings there); ``enclave`` is :func:`process_settings`'s.

    Exit code 0 after SIGINT/SIGTERM (or a ROS shutdown), 1 when a node failed: its
    constructor or a callback raised. Either way every node built so far is torn down first
    (``heisd_ros.nodes._spin``), in reverse order.
    """
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from heisd_ros.nodes._spin import StopRequest, exit_process, spin_until_stopped, tear_down

    os.environ.update(env or {})
    stop = StopRequest().install()
    nodes = []
    failure = ""
    with rclpy.init(args=ros_arguments(plan, enclave),
                    signal_handler_options=SignalHandlerOptions.NO) as init:
        executor = MultiThreadedExecutor(num_threads=threads, context=init.context)
        try:
            for item in plan:
                if stop.signum:  # Ctrl-C while an earlier node was loading: start no more
                    break
                name = item["spec"].name
                try:
                    nodes.append(build_node(item["spec"], item["overrides"], init.context))
                except Exception as exc:  # any failure to start is a dead node: report it
                    traceback.print_exc()
                    failure = stop_reason(name, f"failed to start ({type(exc).__name__}: "
                                                f"{exc})")
                    break
                executor.add_node(nodes[-1])
            if not failure:
                try:
                    spin_until_stopped(executor, stop)
                except Exception as exc:  # a callback raised: that node is dead
                    traceback.print_exc()
                    failure = stop_reason(failed_node(exc, nodes),
                                          f"died ({type(exc).__name__}: {exc})")
            if stop.signum:
                print(f"heisd-bringup: {signal.Signals(stop.signum).name}: stopping every node",
                      file=sys.stderr, flush=True)
        finally:
            tear_down(executor, nodes)
    if failure:
        print(f"heisd-bringup: {failure}", file=sys.stderr)
    exit_process(1 if failure else 0)


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
        env, enclave = process_settings(arguments)
    except ValueError as exc:  # a bad method, sim or security value: say so, start nothing
        print(f"heisd-bringup: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for item in plan:
            print(f"{item['spec'].name}: {item['spec'].module}.{item['spec'].class_name} "
                  f"params={item['params_file']} overrides={item['overrides']} "
                  f"remappings={item['remappings']}")
        print(f"environment: {env} enclave: {enclave[2] if enclave else ''}")
        return 0
    print(f"heisd-bringup: {bringup_skip_line()}", file=sys.stderr, flush=True)
    run(plan, args.threads, env, enclave)


if __name__ == "__main__":
    raise SystemExit(main())
