"""The ROS_DOMAIN_ID allocator: no two live processes (nor two graphs of one) share an id.

The processes here are real subprocesses on the machine's real lock directory, so they also
respect ids that other test runs hold at the moment. Each child starts its scan where the
test says (not at its pid's offset), so children that start together all try the same ids
first: the worst case for contention.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from heisd_ros.testing.domains import (
    DOMAIN_IDS,
    allocate_domain,
    held_domains,
    release_domain,
    reserved_domain,
)
from test.node_process import repo_env

CHILD = """
import json, sys
from heisd_ros.testing import domains
domains._cursor = int(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps([domains.allocate_domain() for _ in range(int(sys.argv[2]))]), flush=True)
sys.stdin.readline()
"""


class Child:
    """A process that, once told to go, allocates ``count`` ids from ``start`` and holds them."""

    def __init__(self, start_id: int, count: int = 1, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(DOMAIN_IDS.index(start_id)), str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=repo_env(**env))
        assert self.proc.stdout.readline().strip() == "ready"

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def ids(self) -> list[int]:
        return json.loads(self.proc.stdout.readline())

    def exit(self) -> None:
        """Let go of the ids (the process ends)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def allocated_by_child(start_id: int, **env: str) -> int:
    """The one id a fresh process starting its scan at ``start_id`` gets."""
    child = Child(start_id, **env)
    try:
        child.go()
        (domain,) = child.ids()
    finally:
        child.exit()
    return domain


def test_the_range_is_the_safe_fast_dds_ids_without_0():
    assert DOMAIN_IDS == tuple(range(1, 102)) + tuple(range(215, 233))


def test_concurrent_processes_never_get_the_same_id():
    with reserved_domain() as mine:
        children = [Child(mine, count=3) for _ in range(4)]
        try:
            for child in children:
                child.go()
            got = [child.ids() for child in children]
        finally:
            for child in children:
                child.exit()
    ids = [domain for each in got for domain in each]
    assert len(set(ids)) == len(ids) == 12, got
    assert mine not in ids and set(ids) <= set(DOMAIN_IDS), (mine, got)


def test_one_process_gets_a_new_id_on_each_call():
    first, second = allocate_domain(), allocate_domain()
    try:
        assert first != second
        assert {first, second} <= set(held_domains())
    finally:
        release_domain(first)
        release_domain(second)
    assert first not in held_domains() and second not in held_domains()
    with pytest.raises(ValueError, match=f"ROS_DOMAIN_ID {first} is not held"):
        release_domain(first)


def test_a_released_id_can_be_taken_again():
    domain = allocate_domain()
    try:
        assert allocated_by_child(domain) != domain
    finally:
        release_domain(domain)
    assert allocated_by_child(domain) == domain


def test_the_id_of_a_killed_process_is_free_again():
    child = Child(DOMAIN_IDS[-1])
    child.go()
    (domain,) = child.ids()
    child.proc.send_signal(signal.SIGKILL)  # no clean-up of its own: the kernel drops the lock
    child.proc.wait(timeout=30)
    assert allocated_by_child(domain) == domain


def test_the_callers_own_ros_domain_id_is_never_handed_out():
    with reserved_domain() as probe:
        pass  # an id free at the moment
    assert allocated_by_child(probe, ROS_DOMAIN_ID=str(probe)) != probe
