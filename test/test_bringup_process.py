"""heisd-bringup for real: the sim graph in one process answers with EE commands over DDS.

With the default method (heisd) and a DB directory that does not exist, the policy runs as
drafter SD and says so; the retrieval node reports the missing DB; nothing dies. Ctrl-C, and
a second one while it stops, ends it with exit code 0, without a traceback, within 2 s (less
the time its threads, and the test's own, waited for a CPU on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from test.node_process import repo_env
from test.polling import spin_until, wait_until
from test.ros_env import require_ros

rclpy, hmsg, _ = require_ros()

from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from test.test_node_policy import tiny_models  # noqa: E402


def run_delay_s(pid: int) -> float | None:
    """Time the threads of process ``pid`` have waited for a CPU, summed (s); None: unknown.

    The stop tears nodes down on several threads, any of which a loaded machine can hold up;
    a thread that sleeps (a join waiting out a timeout, a hang) adds nothing, so a slow stop of
    the process's own making still shows.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    # None: the thread ended between the listing and the read
    delays = [d for d in (_schedstat_delay_s(f"/proc/{pid}/task/{tid}/schedstat")
                          for tid in tids) if d is not None]
    return sum(delays) if delays else None


def own_run_delay_s() -> float | None:
    """Time this test's own thread has waited for a CPU (s): its polling is timed too."""
    return _schedstat_delay_s("/proc/thread-self/schedstat")


def _schedstat_delay_s(path: str) -> float | None:
    """A thread's time runnable on a run queue (s), from Linux's schedstat file; None: unknown.

    The file holds: time on a CPU, time runnable on a run queue, timeslices (ns, ns, count).
    """
    try:
        with open(path) as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


def test_bringup_runs_the_sim_graph_in_one_process(tmp_path, ros_domain):
    vla, _head = tiny_models(tmp_path)
    domain = ros_domain
    env = repo_env(ROS_DOMAIN_ID=str(domain))
    log = tmp_path / "bringup.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "heisd_ros.tools.bringup", "--model", vla,
                                 "--db", str(tmp_path / "no_db"), "--task",
                                 "blue_block_in_basket"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("bringup_test_listener", context=context)
    commands, statuses = [], []
    node.create_subscription(hmsg.EECommand, "/heisd/ee_command", commands.append, 10)
    node.create_subscription(hmsg.EpisodeStatus, "/heisd/episode_status", statuses.append, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        spin_until(executor, lambda: len(commands) >= 3 or proc.poll() is not None, 90)
        text = log.read_text()
        assert len(commands) >= 3, text[-4000:]
        assert statuses and statuses[-1].task == "blue_block_in_basket"
        assert "retrieval DB unavailable" in text  # the missing DB is reported, nothing dies
        # the default method, heisd: `--db` is the policy's DB too; without it, drafter SD
        assert "policy configured: method 'heisd'" in text
        assert ("[policy_node]: heisd runs as drafter SD: no router statistics "
                f"(model.db_dir '{tmp_path / 'no_db'}' is not a directory") in text
    finally:
        start, delay_at_signal = time.monotonic(), run_delay_s(proc.pid)
        own_at_signal = own_run_delay_s()
        proc.send_signal(signal.SIGINT)
        # the second Ctrl-C, once the first is being handled
        wait_until(lambda: "stopping every node" in log.read_text() or proc.poll() is not None)
        proc.send_signal(signal.SIGINT)
        # The wall time of the stop, less the time its threads (which tear the nodes down)
        # and this test's own thread waited for a CPU: on a loaded machine that wait is the
        # machine's, not the stop's. The largest sum seen counts: threads that end take their
        # counts with them.
        starved_s = 0.0

        def ended() -> bool:
            nonlocal starved_s
            delay, own = run_delay_s(proc.pid), own_run_delay_s()  # before the poll reaps it
            if delay is not None and delay_at_signal is not None:
                own_waited = own - own_at_signal if None not in (own, own_at_signal) else 0.0
                starved_s = max(starved_s, delay - delay_at_signal + own_waited)
            return proc.poll() is not None

        if not wait_until(ended, timeout_s=20.0):
            proc.kill()
        code = proc.wait()
        seconds = time.monotonic() - start
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)
    text = log.read_text()
    print(f"\nSHUTDOWN heisd-bringup SIGINT+SIGINT: {seconds:.2f} s ({starved_s:.2f} s of it "
          f"waiting for a CPU), exit code {code}")
    assert code == 0, text[-3000:]
    assert "heisd-bringup: SIGINT: stopping every node" in text
    assert "Traceback" not in text, text[-3000:]
    assert seconds - starved_s < 2.0, (seconds, starved_s)
