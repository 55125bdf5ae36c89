"""The policy's decode worker process: the same steps as in-process, and clear failures.

A real worker process (``python -m heisd_ros.nodes.decode_worker``) on a tiny random model;
nothing is mocked. Its steps must equal the in-process decoder's token for token, a worker
that cannot load names the reason, and a killed worker is reported with its exit code.
"""

from __future__ import annotations

import signal
from dataclasses import asdict

import numpy as np
import pytest

from heisd_ros.data.observation import EpisodeState, Observation
from heisd_ros.nodes.decode_worker import DecodeWorker, WorkerError, WorkerSpec
from heisd_ros.nodes.policy_decoders import ModelConfig, build_decoder, load_target
from test.test_node_policy import SIZE, tiny_models


def observations(n: int, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    return [Observation(rng.integers(0, 255, (SIZE, SIZE, 3), np.uint8),
                        rng.integers(0, 255, (SIZE, SIZE, 3), np.uint8), "stack the blocks",
                        proprio=rng.normal(size=7).astype(np.float32), stamp_s=float(i),
                        episode=EpisodeState("t", step_index=i))
            for i in range(n)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("worker_models"))


@pytest.mark.parametrize("method", ["ar", "drafter"])
def test_the_worker_decodes_what_the_decoder_decodes_in_process(models, method):
    vla, head = models
    config = ModelConfig(path=vla, drafter_path=head, db_dir="")
    logged = []
    worker = DecodeWorker(WorkerSpec(method, asdict(config), "/retrieval_node/retrieve"),
                          lambda level, text: logged.append((level, text)))
    try:
        target, _ = load_target(config)
        here = build_decoder(method, target, config)
        assert worker.description.startswith(here.description), worker.description
        worker.begin_episode("t")
        for obs in observations(4):
            got, want = worker.decode(obs), here.decode(obs)
            np.testing.assert_array_equal(got.bins, want.bins)
            np.testing.assert_allclose(got.action, want.action)
            assert got.source == want.source
            assert got.fields["target_forwards"] == want.fields["target_forwards"]
    finally:
        worker.close()
    assert worker._proc.returncode == 0


def test_a_worker_that_cannot_load_names_the_reason(tmp_path):
    config = ModelConfig(path=str(tmp_path / "missing.safetensors"), db_dir="")
    with pytest.raises(WorkerError, match="missing.safetensors"):
        DecodeWorker(WorkerSpec("ar", asdict(config), "/retrieval_node/retrieve"),
                     lambda level, text: None)


def test_a_killed_worker_is_reported_with_its_exit_code(models):
    vla, _ = models
    worker = DecodeWorker(WorkerSpec("ar", asdict(ModelConfig(path=vla, db_dir="")),
                                     "/retrieval_node/retrieve"), lambda level, text: None)
    try:
        worker._proc.send_signal(signal.SIGKILL)
        worker._proc.wait(timeout=30)
        with pytest.raises(WorkerError, match=rf"pid {worker.pid}\) exited with code -9"):
            worker.decode(observations(1)[0])
    finally:
        worker.close()
