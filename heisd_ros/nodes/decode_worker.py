"""The policy's decoder in a process of its own, so the node's executor cannot starve it.

Why: the decoder runs thousands of small, Python-dispatched torch operations per action (a
7B forward on a GPU too), each of which needs the GIL. In the node's process the executor
wakes for every robot state (the PIPER driver publishes /joint_states and /ee_pose at 200 Hz)
and every camera frame, and its Python wait-set bookkeeping held the GIL most of the time: a
decode that takes 125 ms alone took 0.8-3.3 s in the node, and every command was held as
stale. In its own process the decoder has its own interpreter and GIL, and the node's
executor keeps serving diagnostics, services and holds while a step decodes.

The worker is ``python -m heisd_ros.nodes.decode_worker --fd N``, started by
:class:`DecodeWorker` with one end of a socket pair; both ends speak pickled tuples over a
:class:`multiprocessing.connection.Connection`:

- node -> worker: ``("decode", Observation)``, ``("begin_episode", task)``,
  ``("episode_end", success)``, ``("stop",)``.
- worker -> node: ``("ready", target description, decoder description, degraded)`` or
  ``("error", reason)`` once the models are loaded; per decode ``("step", DecodedStep,
  degraded, retrieval_available)`` or ``("failed", reason)``; at any time ``("log", level,
  text)``.

The worker loads the models itself from the node's ``model.*`` settings (plain data), so the
target, the draft head and CUDA live only there. Retrieval methods get their own small rclpy
node in the worker (``<policy name>_decoder``, in the policy's namespace) whose only entity is
the Retrieve client: its executor wakes for the answers alone. The worker ignores SIGINT (the
node stops it in order) and exits when the node's end of the socket closes, so a node killed
with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

#: How long the node waits for the worker to load its models, s (a 7B checkpoint from a slow
#: disk takes minutes).
READY_TIMEOUT_S = 900.0
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker needs to build the node's decoder: plain data only.

    Attributes:
        method: the decoder method (``heisd_ros.decoding.methods.METHODS``).
        model: the node's ``model.*`` settings as a dict (``ModelConfig`` fields).
        retrieval_service: the fully resolved Retrieve service name.
        node_name, namespace: the policy node's, for the worker's retrieval node.
    """

    method: str
    model: dict
    retrieval_service: str
    node_name: str = "policy_node"
    namespace: str = "/"


class WorkerError(RuntimeError):
    """The worker could not be started, failed to load, or died."""


class DecodeWorker:
    """The node's handle on its decode worker process.

    ``submit`` hands an observation over and returns at once; ``result`` waits for that step.
    ``begin_episode`` and ``episode_end`` are queued behind a running decode (the worker takes
    its messages in order). Thread-safe: one step at a time, any thread may queue episode
    messages.
    """

    def __init__(self, spec: WorkerSpec, log, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the worker and wait until its models are loaded.

        Args:
            spec: what to build.
            log: ``log(level, text)`` for the worker's messages ("info", "warning", "error").
            ready_timeout_s: longest wait for the models to load, s.

        Raises:
            WorkerError: the worker exited or timed out while loading (with its reason).
        """
        self._log = log
        self._send_lock = threading.Lock()
        self.description = ""  # the decoder's, as the in-process decoders say it
        self.target_description = ""
        self.degraded = ""
        self.retrieval_available: bool | None = None
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "heisd_ros.nodes.decode_worker", "--fd",
               str(theirs.fileno())]
        self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._send(("spec", asdict(spec)))
        deadline = time.monotonic() + ready_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise WorkerError(f"the decode worker did not load its models within "
                                  f"{ready_timeout_s:.0f} s")
            message = self._receive(remaining)
            if message is None:
                continue
            if message[0] == "ready":
                _, self.target_description, description, self.degraded = message
                self.description = f"{description} (decode worker pid {self._proc.pid})"
                return
            if message[0] == "error":
                self.close()
                raise WorkerError(message[1])

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._proc.pid

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:  # the worker is gone
                raise WorkerError(self._death(f"cannot reach it ({exc})")) from None

    def _death(self, what: str) -> str:
        code = self._proc.poll()
        return (f"the decode worker (pid {self._proc.pid}) "
                + (f"exited with code {code}" if code is not None else what))

    def _receive(self, timeout_s: float) -> tuple | None:
        """The next message that is not a log line (those are passed on), None on timeout."""
        try:
            if not self._conn.poll(timeout_s):
                return None
            message = self._conn.recv()
        except (EOFError, OSError):
            self._proc.wait(timeout=5.0)
            raise WorkerError(self._death("closed its connection")) from None
        if message[0] == "log":
            self._log(message[1], message[2])
            return None
        return message

    def submit(self, observation) -> None:
        """Start decoding ``observation``; fetch the step with :meth:`result`."""
        self._send(("decode", observation))

    def result(self):
        """The step of the last :meth:`submit` (``DecodedStep``).

        Raises:
            ValueError: the decoder rejected the observation (the reason).
            WorkerError: the worker died.
        """
        while True:
            message = self._receive(1.0)
            if message is None:
                continue
            if message[0] == "step":
                _, step, self.degraded, self.retrieval_available = message
                return step
            if message[0] == "failed":
                raise ValueError(message[1])

    def decode(self, observation):
        """Decode one observation and wait for its step (submit, then result)."""
        self.submit(observation)
        return self.result()

    def begin_episode(self, task: str | None = None) -> None:
        """Start a new episode in the worker's decoder before its next step."""
        self._send(("begin_episode", task))

    def episode_end(self, success: bool) -> None:
        """Tell the worker's decoder how the episode ended."""
        self._send(("episode_end", bool(success)))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (after its current step), killing it if it does not exit."""
        try:
            self._send(("stop",))
        except WorkerError:
            pass
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._conn.close()


# ---------------------------------------------------------------------------- the worker side
class _RetrievalNode:
    """A private rclpy context with one node holding the Retrieve client, spun in a thread."""

    def __init__(self, spec: WorkerSpec) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from heisd_ros.nodes.retrieval_client import RetrievalServiceClient

        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node(f"{spec.node_name}_decoder", namespace=spec.namespace,
                                      context=self.context)
        self.client = RetrievalServiceClient(self.node, spec.retrieval_service)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True,
                                        name="retrieval-client")
        self._thread.start()

    def _spin(self) -> None:
        while self.context.ok():
            try:
                self.executor.spin_once(timeout_sec=0.1)
            except Exception:  # noqa: BLE001 - shutting down under the spin
                if not self.context.ok():
                    return
                raise

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def _serve(conn: Connection) -> int:
    """Build the decoder from the spec, then decode until told to stop or the node is gone."""
    from heisd_ros.decoding.methods import METHODS, check_method
    from heisd_ros.nodes.policy_decoders import ModelConfig, build_decoder, load_target, warm_up

    def log(level: str, text: str) -> None:
        conn.send(("log", level, text))

    kind, fields = conn.recv()
    if kind != "spec":
        raise WorkerError(f"expected the spec first, got {kind!r}")
    spec = WorkerSpec(**fields)
    retrieval = None
    try:
        method = check_method(spec.method)
        if METHODS[method].hybrid:
            retrieval = _RetrievalNode(spec)
        target, target_description = load_target(ModelConfig(**spec.model))
        decoder = build_decoder(method, target, ModelConfig(**spec.model),
                                retrieval and retrieval.client,
                                warn=lambda text: log("warning", text))
        warm_up(target)
    except (OSError, ValueError, ImportError, RuntimeError, KeyError) as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return 1
    conn.send(("ready", target_description, decoder.description, decoder.degraded))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the node is gone
                return 0
            kind = message[0]
            if kind == "decode":
                try:
                    step = decoder.decode(message[1])
                except (ValueError, RuntimeError) as exc:
                    conn.send(("failed", str(exc)))
                    continue
                conn.send(("step", step, decoder.degraded,
                           retrieval.client.available if retrieval else None))
            elif kind == "begin_episode":
                decoder.begin_episode(message[1])
            elif kind == "episode_end":
                decoder.episode_end(message[1])
            elif kind == "stop":
                return 0
    finally:
        if retrieval is not None:
            retrieval.close()


def main(argv=None) -> int:
    """Run the worker on the inherited socket ``--fd``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node stops the worker in order
    conn = Connection(args.fd)
    try:
        return _serve(conn)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return 0  # the node is gone
    except pickle.PicklingError as exc:
        conn.send(("error", f"cannot send a result: {exc}"))
        return 1


if __name__ == "__main__":
    # Not sys.exit: the interpreter's finalisation with torch loaded took 1-2 s of every
    # stop (the node waits for the worker), as it did in the node processes.
    from heisd_ros.nodes._exit import exit_process

    exit_process(main())
