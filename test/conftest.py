"""Fixtures several test modules share; pytest finds them here, so no test imports them.

The tiny models are session-scoped (training them is the expensive part). A checkpoint file
or a demos directory is written once per module that asks for it (module scope), so a test
module may change its copy without touching another module's.

Imports of the model code happen inside the fixtures: a broken model module then fails the
tests that use the models, not the collection of every test.

A test that runs ROS 2 nodes takes its DDS domain from ``ros_domain`` (one test) or
``module_ros_domain`` (a module's shared graph); code outside a fixture uses
:func:`heisd_ros.testing.domains.reserved_domain`. Each id is released when its scope ends, so
a session holds only the few ids of the tests running at the moment.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_random_vla():
    """A seeded random small VLA of ``TINY`` size (2 layers, hidden 64)."""
    from heisd_ros.models.small_vla import SmallVLA
    from test.fixtures_decoding import TINY

    return SmallVLA.random(TINY, seed=1)


@pytest.fixture(scope="session")
def tiny_trained_vla():
    """The same architecture trained briefly on scripted actions: input-dependent, confident."""
    from heisd_ros.models.small_vla import SmallVLA
    from test.fixtures_decoding import TINY, scenes, train_tiny_vla

    return train_tiny_vla(SmallVLA.random(TINY, seed=2), scenes(48, seed=100), steps=100)


@pytest.fixture(scope="session")
def tiny_drafter(tiny_trained_vla):
    """A draft head self-distilled from ``tiny_trained_vla``."""
    from test.fixtures_decoding import scenes, train_drafter

    return train_drafter(tiny_trained_vla, scenes(48, seed=200), steps=80)


@pytest.fixture(params=["random", "trained"], scope="module")
def tiny_vla(request, tiny_random_vla, tiny_trained_vla):
    """Each tiny VLA in turn: the random one, then the trained one."""
    return tiny_random_vla if request.param == "random" else tiny_trained_vla


@pytest.fixture(scope="module")
def tiny_target_path(tiny_random_vla, tmp_path_factory) -> str:
    """``tiny_random_vla`` saved as a float32 safetensors file (the same weights, bit for bit)."""
    from heisd_ros.models.checkpoint import save_small_vla

    path = tmp_path_factory.mktemp("tiny_target") / "vla.safetensors"
    return str(save_small_vla(tiny_random_vla, path, dtype="float32"))


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """An npz demos root: suite_a with task_a (2 episodes) and task_b (1), T_STEPS steps each."""
    from test.fixtures_demos import write_demos

    return write_demos(tmp_path_factory.mktemp("demos"))


@pytest.fixture
def ros_domain():
    """A ROS_DOMAIN_ID no other process on this machine holds, for this test only."""
    from heisd_ros.testing.domains import reserved_domain

    with reserved_domain() as domain:
        yield domain


@pytest.fixture(scope="module")
def module_ros_domain():
    """A ROS_DOMAIN_ID no other process on this machine holds, for this test module."""
    from heisd_ros.testing.domains import reserved_domain

    with reserved_domain() as domain:
        yield domain
