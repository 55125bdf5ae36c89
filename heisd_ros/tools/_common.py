"""Command-line helpers shared by the tools: argparse options, parsing, thread limits, SIGTERM.

Loading the target is library code: ``heisd_ros.models.loading``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from heisd_ros.models import loading


def add_model_arguments(parser, closed_loop: bool = False) -> None:
    """The target's options (``loading.TargetChoice``), the same in every tool.

    ``--model``, ``--checkpoint``, ``--unnorm-key``, ``--device``, ``--dtype``,
    ``--center-crop``, ``--vision-specs``; with ``closed_loop`` (a tool that runs a control
    loop) also ``--allow-cpu``, without which an OpenVLA target on a CPU is refused.
    """
    group = parser.add_argument_group("target model")
    group.add_argument("--model", choices=loading.MODELS, default="small",
                       help="target VLA: the small VLA (--target, default: shipped), or an "
                            "OpenVLA checkpoint (--checkpoint)")
    group.add_argument("--checkpoint", default=None, metavar="DIR",
                       help="OpenVLA: the local Hugging Face checkpoint directory (never "
                            "downloaded)")
    group.add_argument("--unnorm-key", default=None, metavar="KEY",
                       help="OpenVLA: dataset statistics to un-normalise with (a key of "
                            "dataset_statistics.json; KEY_no_noops is tried too)")
    group.add_argument("--device", default=None,
                       help="OpenVLA: cuda, cuda:1, cpu (default: CUDA when available)")
    group.add_argument("--dtype", choices=loading.DTYPES, default=None,
                       help="OpenVLA: weight precision (default: bfloat16 on CUDA, float32 on "
                            "a CPU)")
    group.add_argument("--center-crop", action="store_true",
                       help="OpenVLA: crop the central 90%% of the image area first, for "
                            "checkpoints fine-tuned with random-crop augmentation (OpenVLA's "
                            "LIBERO fine-tunes)")
    group.add_argument("--vision-specs", default=None, metavar="JSON",
                       help="OpenVLA: backbone sizes for a checkpoint whose backbones are not "
                            "the ones its config.json names (default: from config.json)")
    if closed_loop:
        group.add_argument("--allow-cpu", action="store_true",
                           help="OpenVLA: run on the CPU although no GPU is used (a 7B model "
                                "takes seconds per action there: debugging only; refused "
                                "without this)")


def add_decoder_arguments(parser, closed_loop: bool = False) -> None:
    """The options every tool that builds decoders by method name shares (eval, record, replay).

    The target's options of :func:`add_model_arguments` (``closed_loop``: with
    ``--allow-cpu``), ``--target``, ``--drafter``, ``--db``, ``--router-stats``, ``--calibration``,
    ``--gripper-switch-prob``, ``--retrieval-tree-nodes``, ``--retrieval-deadline-ms``: see
    ``heisd_ros.eval.methods``.
    """
    parser.add_argument("--target", default=None, help="small-VLA safetensors (default: shipped)")
    add_model_arguments(parser, closed_loop)
    parser.add_argument("--drafter", default=None,
                        help="draft head safetensors (default: the shipped head with the "
                             "shipped small VLA; any other target gets an untrained head, "
                             "with a warning and drafter_untrained in the report)")
    parser.add_argument("--db", default=None,
                        help="embedded retrieval DB directory from heisd-build-db (hybrid methods)")
    parser.add_argument("--router-stats", default=None,
                        help="router statistics JSON (default: <db>/router_stats_<suite>.json)")
    parser.add_argument("--calibration", default=None, help="verify-skip calibration JSON")
    parser.add_argument("--gripper-switch-prob", default=None, metavar="P",
                        help="gripper decision rule of the target: change the gripper's state "
                             "when the other state's total probability reaches P in (0, 1); "
                             "'none' = plain greedy (default: what the checkpoint carries)")
    from heisd_ros.decoding.retrieval_tree import GroupTreeConfig

    parser.add_argument("--retrieval-tree-nodes", type=int, default=None, metavar="N",
                        help="node budget of the retrieval group tree verified in the prefill "
                             f"forward (hybrid methods; default {GroupTreeConfig().node_budget}). "
                             "On a CPU every node costs compute; on a GPU the forward is "
                             "memory-bound and nodes are cheap")
    parser.add_argument("--skip-threshold", type=float, default=None, metavar="S",
                        help="verify-skip similarity threshold (cosine), over the calibration's "
                             "(hybrid methods; e.g. one tuned on closed-loop validation "
                             "episodes; default: the calibration's)")
    parser.add_argument("--router-threshold", type=float, default=None, metavar="F",
                        help="the router's threshold on its fused metric F in [0, 1], over the "
                             "calibration's: only steps with F >= it may run unverified, and "
                             "router_only, router_skip and heisd_paper draft from retrieval "
                             "only there (router methods; 0 = every step with a full window; "
                             "default: the calibration's)")
    parser.add_argument("--max-unverified-run", type=int, default=None, metavar="N",
                        help="most steps executed without the target VLA in a row, then a "
                             "verified one (hybrid methods; 0 = never unverified; default: "
                             "2)")
    from heisd_ros.decoding.unverified import UnverifiedConfig

    parser.add_argument("--follow-min-similarity", type=float, default=None, metavar="S",
                        help="least cosine similarity of the followed demonstration's next "
                             "point for a step to follow it without the target VLA (methods "
                             "with the follow rule; default "
                             f"{UnverifiedConfig().follow_min_similarity:g})")
    from heisd_ros.decoding.retrieval_accept import GroupAcceptConfig

    paper = GroupAcceptConfig()
    parser.add_argument("--accept-token-max-bins", type=int, default=None, metavar="N",
                        help="relaxed acceptance of retrieval drafts and checks behind: most "
                             "bins a draft token may differ from the target's (hybrid "
                             f"methods; default {paper.token_max_bins}, the paper's)")
    parser.add_argument("--accept-group-sum-max-bins", type=int, default=None, metavar="N",
                        help="the same for a group's tokens together (default "
                             f"{paper.group_sum_max_bins}, the paper's)")
    parser.add_argument("--router-min-points", type=int, default=None, metavar="N",
                        help="fewest EE positions from which the router decides (3..its "
                             "window); the first steps of an episode, with fewer, are "
                             "drafter-routed (router methods; default: a full window)")
    from heisd_ros.decoding.retrieval_source import RetrievalSourceConfig

    parser.add_argument("--retrieval-deadline-ms", type=float, default=None, metavar="MS",
                        help="time budget of one retrieval query; a later answer is dropped "
                             "and the step decodes without it (hybrid methods; default "
                             f"{RetrievalSourceConfig().deadline_s * 1e3:g} ms; 0 = none, which "
                             "makes a run repeatable on a loaded machine)")


def load_target_from_args(args, closed_loop: bool = False):
    """``loading.load_choice`` of a tool's target options (:func:`add_model_arguments`).

    A caller embedding a tool may set ``args.openvla_options`` (a dict) for options that have
    no command-line flag.
    """
    return loading.load_choice(loading.TargetChoice.from_args(args, closed_loop),
                               getattr(args, "seed", 0),
                               openvla_options=getattr(args, "openvla_options", None))


def recorded_episodes(offline: dict, key: str, option: str) -> list[Path]:
    """The episodes ``offline_stats.json`` lists under ``key``; a moved one is named.

    ``heisd-build-db`` records them as absolute paths, so a tool may run from any directory;
    a DB copied to another machine lists paths that are not there: ValueError naming the
    file, the path and the tool's ``option`` that reads the episodes from elsewhere.
    """
    paths = [Path(p) for p in offline.get(key) or []]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"offline_stats.json lists {len(missing)} of {len(paths)} {key} that "
                         f"are not here (first: {missing[0]}; moved, or built elsewhere): "
                         f"pass {option} DIR")
    return paths


def episode_loader(offline: dict):
    """A reader of the episodes a DB lists, as heisd-build-db read them (npz, or rosbag2).

    ``offline`` is the DB's ``offline_stats.json``; bags are read with the options recorded
    there (topics, pairing skew, identity defaults).
    """
    from heisd_ros.data.bag_episodes import EpisodeDefaults, EpisodeTopics, load_any_episode
    from heisd_ros.data.bag_topics import resolve_cameras
    from heisd_ros.data.rosbag_io import metadata_topics

    options = offline.get("bag_options") or {}
    topics = options.get("topics") or {}
    defaults = EpisodeDefaults(options.get("suite"), options.get("task"),
                               options.get("instruction"))
    max_skew_s = float(options.get("max_skew_s", 0.05))
    gripper_joint = options.get("gripper_joint", "gripper")

    def load(path):
        if not Path(path).is_dir():
            return load_any_episode(path)
        # a camera left unset at build time: its default topic or /compressed, per bag
        found = EpisodeTopics(**resolve_cameras({"primary": None, "wrist": None, **topics},
                                                metadata_topics(path)))
        return load_any_episode(path, found, defaults, max_skew_s, gripper_joint)

    return load


def int_vector(text: str, length: int, name: str) -> tuple[int, ...]:
    """Parse "a,b,c" (or a single value repeated) into ``length`` ints."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError as err:
        raise ValueError(f"{name}: expected comma-separated ints, got {text!r}") from err
    if len(values) == 1:
        values = values * length
    if len(values) != length:
        raise ValueError(f"{name}: expected {length} values, got {len(values)}")
    return tuple(values)


def set_threads(threads: int | None) -> None:
    """Limit torch's intra-op threads (the machine is shared; benches should say how many)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM unwinds like Ctrl-C (``KeyboardInterrupt("SIGTERM")``).

    A tool's own Ctrl-C handling (stop its workers or children, write what it has) then runs
    on either signal. Off the main thread, where no handler can be set, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
