"""``heisd-bench graph``'s figures per method and its Markdown report (and plot).

:func:`method_report` turns one method's graph phase (:func:`.phases.run_graph_phase`) and
its in-process phase (:class:`.inprocess.InProcess`) into the figures the JSON and the tables
carry; :func:`format_markdown` writes the tables; :func:`plot_step_times` the histograms.
Where each figure comes from: the docstring of :mod:`heisd_ros.tools.graph.bench_cli`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heisd_ros.decoding.behind import BEHIND_REJECTED
from heisd_ros.tools.graph.figures import (
    AGREE_TOLERANCE,
    agree,
    counter_deltas,
    finite_float,
    frame_clock_rate_hz,
    held_by_reason,
    node_wall_time,
    ratio,
    stage_medians,
    step_sources,
    summary,
    true_share,
)
from heisd_ros.tools.graph.listener import STAGES

#: A command rate at least this share of the in-process decode rate passes.
RATE_FRACTION = 0.8
#: In-process figures of a method run under a retrieval fault.
FAULT_NA = "n/a (fault drill)"


def method_report(phase: dict, inprocess: dict, policy_limit_s: float,
                  driver_limit_s: float | None) -> dict:
    """The figures of one method from its graph phase and its in-process phase.

    ``phase``: ``duration_s``, ``ages_s`` (per command), ``hybrid_total_ms`` (per sent step),
    ``held_ms`` (logged decode times), ``policy_before``/``policy_after`` and
    ``driver_before``/``driver_after`` (diagnostic values). ``inprocess``: ``wall_ms`` and
    ``total_ms`` per decode (may be empty).
    """
    duration = float(phase["duration_s"])
    ages_ms = [a * 1e3 for a in phase.get("ages_s", [])]
    sent = len(phase.get("hybrid_total_ms", []))
    policy_after = phase.get("policy_after") or {}
    node_wall = node_wall_time(phase.get("held_ms", []), sent, policy_after,
                               phase.get("policy_before"))
    inproc = summary(inprocess.get("wall_ms", []))
    inproc_total = summary(inprocess.get("total_ms", []))
    node_total = summary(phase.get("hybrid_total_ms", []))
    rate = len(ages_ms) / duration if duration > 0 else None
    required = (RATE_FRACTION / (inproc["mean"] / 1e3)) if inproc and inproc["mean"] > 0 \
        else None
    camera_hz = float(phase.get("camera_hz") or 0.0)
    clock_rate = frame_clock_rate_hz(inprocess.get("wall_ms", []), camera_hz)
    required_clock = RATE_FRACTION * clock_rate if clock_rate else None
    driver_after = phase.get("driver_after") or {}
    return {
        "node_wall_ms": node_wall,
        "node_held_log_ms": summary(phase.get("held_ms", [])),
        "node_diagnostics_ms": {k: finite_float(policy_after, k) for k in
                                ("decode_p50_ms", "decode_p99_ms", "decoded_steps",
                                 "held_stale_share")} if "decode_p50_ms" in policy_after
        else None,
        "node_hybrid_total_ms": node_total,
        "inprocess_wall_ms": inproc,
        "inprocess_total_ms": inproc_total,
        "ratio_p50": ratio(node_wall and node_wall["p50"], inproc and inproc["p50"]),
        "ratio_p99": ratio(node_wall and node_wall["p99"], inproc and inproc["p99"]),
        "total_ratio_p50": ratio(node_total and node_total["p50"],
                                 inproc_total and inproc_total["p50"]),
        "total_ratio_p99": ratio(node_total and node_total["p99"],
                                 inproc_total and inproc_total["p99"]),
        "node_steps": {"sent": sent, "held_stale_logged": len(phase.get("held_ms", []))},
        "commands": len(ages_ms),
        "command_rate_hz": rate,
        "required_rate_hz": required,
        "rate_pass": None if rate is None or required is None else rate >= required,
        "inprocess_frame_clock_rate_hz": clock_rate,
        "required_frame_clock_rate_hz": required_clock,
        "rate_pass_frame_clock": None if rate is None or required_clock is None
        else rate >= required_clock,
        "stage_ms_p50": {"node": stage_medians(phase.get("hybrid_stages", [])),
                         "inprocess": stage_medians(inprocess.get("stages", []))},
        "age_ms": summary(ages_ms),
        "policy_max_command_age_s": policy_limit_s,
        "driver_max_command_age_s": driver_limit_s,
        "over_policy_limit": sum(a > policy_limit_s * 1e3 for a in ages_ms),
        "over_driver_limit": None if driver_limit_s is None
        else sum(a > driver_limit_s * 1e3 for a in ages_ms),
        "held_by_reason": held_by_reason(phase.get("policy_before") or {}, policy_after),
        "driver_commands": counter_deltas(phase.get("driver_before") or {}, driver_after,
                                          "commands_"),
        "driver_last_rejected_reason": driver_after.get("last_rejected_reason", ""),
        "driver_status": driver_after.get("status", ""),
        "driver_watchdog_holds": phase.get("driver_watchdog_holds"),
        "verify_skip_share": {"node": true_share(phase.get("hybrid_verify_skipped", [])),
                              "inprocess": true_share(inprocess.get("verify_skipped", []))},
        "hybrid_steps": step_sources(phase.get("hybrid_status", []),
                                     phase.get("hybrid_draft_source", []),
                                     phase.get("hybrid_verify_skipped", [])),
        "checks_behind": behind_counts(phase.get("hybrid_behind", [])),
        "retrieval_fault": phase.get("retrieval_fault"),
        "bench_frames": phase.get("bench_frames"),
        "bench_states": phase.get("bench_states"),
    }


def behind_counts(behind: Sequence[tuple[int, float]]) -> dict | None:
    """Checks behind collected by the sent steps (``heisd_behind``): verdicts and waits.

    ``behind``: per step (``HybridStep.behind_result``, ``behind_wait_ms``); None when no
    step collected one.
    """
    collected = [(r, w) for r, w in behind if r]
    if not collected:
        return None
    waits = [w for _, w in collected if w > 0.1]
    return {"collected": len(collected),
            "rejected": sum(r == BEHIND_REJECTED for r, _ in collected),
            "waited": len(waits), "wait_ms_p50": float(np.median(waits)) if waits else 0.0}


def heisd_vs_ar(reports: dict[str, dict], method: str = "heisd") -> dict | None:
    """HeiSD's command-rate ratio vs AR next to its in-process speed ratio; None without both."""
    if method not in reports or "ar" not in reports:
        return None
    ours, ar = reports[method], reports["ar"]
    rate_ratio = ratio(ours["command_rate_hz"], ar["command_rate_hz"]) \
        if ar["command_rate_hz"] else None
    speed = ratio(ar["inprocess_wall_ms"] and ar["inprocess_wall_ms"]["mean"],
                  ours["inprocess_wall_ms"] and ours["inprocess_wall_ms"]["mean"])
    clock = ratio(ours.get("inprocess_frame_clock_rate_hz"),
                  ar.get("inprocess_frame_clock_rate_hz"))
    return {"method": method, "command_rate_ratio": rate_ratio,
            "inprocess_speed_ratio": speed, "agree_within": AGREE_TOLERANCE,
            "agree": agree(rate_ratio, speed),
            "inprocess_frame_clock_ratio": clock,
            "agree_frame_clock": agree(rate_ratio, clock)}


def rate_vs_drafter(reports: dict[str, dict]) -> dict[str, float | None]:
    """Each faulted method's command rate / the drafter method's (None without both)."""
    drafter = reports.get("drafter") or {}
    return {name: ratio(r.get("command_rate_hz"), drafter.get("command_rate_hz"))
            for name, r in reports.items() if r.get("retrieval_fault") and not r.get("error")}


# ------------------------------------------------------------------ Markdown
def _f(value, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _pair(s: dict | None, fmt: str = ".0f") -> str:
    return "n/a" if not s else f"{s['p50']:{fmt}} / {s['p99']:{fmt}}"


_SOURCE_TAGS = {"log: every": "log", "diagnostics": "diag", "log: held": "log-held"}


def _source_tag(node_wall: dict | None) -> str:
    if not node_wall:
        return "-"
    tag = next((tag for prefix, tag in _SOURCE_TAGS.items()
                if node_wall["source"].startswith(prefix)), "?")
    if node_wall.get("before_window"):
        tag += f" ({node_wall['before_window']} of {node_wall['n']:.0f} before)"
    return tag


def format_markdown(result: dict) -> str:
    """The run's Markdown: step times, commands at the driver, HeiSD vs AR, sources."""
    setup = result["setup"]
    lines = [f"## heisd-bench graph ({setup['date']})", "",
             f"{setup['duration_s']:g} s per method after the policy was ready; cameras "
             f"{setup['camera_hz']:g} Hz ({setup['image']}), robot state {setup['state_hz']:g} "
             f"Hz; observations: {setup['observations']}; DDS domain {setup['domain']}; "
             f"policy `model.threads` {setup['threads']}; policy parameters: shipped"
             + "".join(f", {k}={v}" for k, v in (setup.get("policy_param") or {}).items())
             + ".", "",
             "### Step time, ms: node vs in-process", "",
             "| method | node wall p50 / p99 | src | in-process p50 / p99 | in-process mean "
             "| ratio p50 / p99 | node total_ms p50 / p99 (sent) | in-process total_ms "
             "p50 / p99 | total_ms ratio p50 / p99 | steps node sent+held / in-process |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            lines.append(f"| {name} | failed: {r['error']} |" + " |" * 8)
            continue
        inproc = r["inprocess_wall_ms"]
        steps = r["node_steps"]
        sent_held = f"{steps['sent']}+{steps['held_stale_logged']}"
        if r.get("retrieval_fault"):
            lines.append(
                f"| {name} (fault: {r['retrieval_fault']['mode']}) | {_pair(r['node_wall_ms'])} "
                f"| {_source_tag(r['node_wall_ms'])} | {FAULT_NA} | {FAULT_NA} | {FAULT_NA} | "
                f"{_pair(r['node_hybrid_total_ms'])} | {FAULT_NA} | {FAULT_NA} | {sent_held} / "
                f"{FAULT_NA} |")
            continue
        lines.append(
            f"| {name} | {_pair(r['node_wall_ms'])} | {_source_tag(r['node_wall_ms'])} | "
            f"{_pair(inproc)} | {_f(inproc and inproc['mean'])} | {_f(r['ratio_p50'], '.2f')} "
            f"/ {_f(r['ratio_p99'], '.2f')} | {_pair(r['node_hybrid_total_ms'])} | "
            f"{_pair(r['inprocess_total_ms'])} | {_f(r['total_ratio_p50'], '.2f')} / "
            f"{_f(r['total_ratio_p99'], '.2f')} | {sent_held} / {inproc['n'] if inproc else 0} |")
    lines += ["", "### Commands at the driver", "",
              "| method | commands | rate /s | needed (0.8/mean) | pass | needed at the frame "
              "clock (0.8 x in-process rate at the camera rate) | pass | age p50 / p99 / max ms "
              "| > driver limit | > policy limit | driver received/executed/rejected | "
              "driver watchdog holds | held by reason |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        if r.get("error"):
            continue
        age = r["age_ms"]
        ages = "n/a" if not age else f"{age['p50']:.0f} / {age['p99']:.0f} / {age['max']:.0f}"
        d = r["driver_commands"]
        held = ", ".join(f"{k}: {n}" for k, n in sorted(r["held_by_reason"].items())) or "-"
        passed = {None: "n/a", True: "pass", False: "FAIL"}[r["rate_pass"]]
        needed = _f(r['required_rate_hz'], '.2f')
        passed_clock = {None: "n/a", True: "pass", False: "FAIL"}[
            r.get("rate_pass_frame_clock")]
        needed_clock = _f(r.get("required_frame_clock_rate_hz"), ".2f")
        if r.get("retrieval_fault"):
            needed = passed = needed_clock = passed_clock = FAULT_NA
        lines.append(
            f"| {name} | {r['commands']} | {_f(r['command_rate_hz'], '.2f')} | "
            f"{needed} | {passed} | {needed_clock} | {passed_clock} | {ages} | "
            f"{r['over_driver_limit']} (> {_f(r['driver_max_command_age_s'], 'g')} s) | "
            f"{r['over_policy_limit']} (> {r['policy_max_command_age_s']:g} s) | "
            f"{d.get('commands_received', 'n/a')}/{d.get('commands_executed', 'n/a')}/"
            f"{d.get('commands_rejected', 'n/a')} | {_f(r.get('driver_watchdog_holds'), 'd')} "
            f"| {held} |")
    lines += format_status_table(result)
    lines += ["", "### Median stage times, ms: node (HybridStep) / in-process", "",
              "| method | " + " | ".join(k[:-3] for k in STAGES) + " |",
              "| --- |" + " --- |" * len(STAGES)]
    for name, r in result["methods"].items():
        st = r.get("stage_ms_p50") or {}
        node, inproc = st.get("node") or {}, st.get("inprocess") or {}
        if node or inproc:
            lines.append(f"| {name} | " + " | ".join(
                f"{_f(node.get(k), '.1f')} / {_f(inproc.get(k), '.1f')}" for k in STAGES) + " |")
    cmp_ = result.get("heisd_vs_ar")
    if cmp_:
        verdict = {None: "n/a", True: "yes", False: "no"}
        lines += ["", "### HeiSD vs AR", "",
                  "| command-rate ratio heisd/ar | in-process speed ratio (AR mean / HeiSD "
                  "mean) | agree within 10% | in-process ratio at the frame clock | agree "
                  "within 10% |", "| --- | --- | --- | --- | --- |",
                  f"| {_f(cmp_['command_rate_ratio'], '.2f')} | "
                  f"{_f(cmp_['inprocess_speed_ratio'], '.2f')} | {verdict[cmp_['agree']]} | "
                  f"{_f(cmp_.get('inprocess_frame_clock_ratio'), '.2f')} | "
                  f"{verdict[cmp_.get('agree_frame_clock')]} |"]
    lines += ["", "Sources: node wall `log` = the policy log's held steps (\"decode took N ms\", "
              "every decoded step when none was sent); `diag` = the policy's /diagnostics "
              "decode_p50_ms/decode_p99_ms (last decoded steps, sent and held, may include "
              "steps before the window); `log-held` = held steps only. node total_ms = "
              "HybridStep.total_ms of the steps sent (the decoder's own timing). In-process = "
              "perf_counter around decode() on the node's observations in its order (and the "
              "decoder's total_ms). Ratios = node / in-process. Command age = arrival here - "
              "header.stamp; held by reason = change of refused[<kind>] on /diagnostics; "
              "driver counts = change of commands_* on its /diagnostics."]
    for name, r in result["methods"].items():
        frames, states = r.get("bench_frames") or {}, r.get("bench_states") or {}
        played = (f"played {_f(frames.get('rate_hz'), '.1f')} frame pairs/s (largest gap "
                  f"{_f(frames.get('max_gap_ms'))} ms), {_f(states.get('rate_hz'), '.0f')} "
                  f"robot states/s (largest gap {_f(states.get('max_gap_ms'))} ms)"
                  if frames else None)
        skip = r.get("verify_skip_share") or {}
        skips = (f"verify-skipped steps: node {_f(skip['node'], '.0%')}, in-process "
                 f"{_f(skip['inprocess'], '.0%')}" if skip.get("node") or skip.get("inprocess")
                 else None)
        load = r.get("load_avg_1min")
        loads = (f"1-min load average {load['graph_end']:.1f} at the graph's end"
                 + (f", {load['inprocess_end']:.1f} at the in-process phase's end"
                    if load.get("inprocess_end") is not None else "") if load else None)
        status = r.get("driver_status")
        status = f"driver controller {status} at the end" if status not in (None, "",
                                                                            "running") else None
        killed = (r.get("retrieval_fault") or {}).get("killed")
        notes = [n for n in (r.get("inprocess_order"), killed, played, skips, loads, status,
                             r.get("died"),
                             r.get("driver_last_rejected_reason")
                             and f"driver's last rejection: {r['driver_last_rejected_reason']}")
                 if n]
        if notes:
            lines.append(f"- {name}: " + "; ".join(str(n) for n in notes))
    return "\n".join(lines) + "\n"


def _status_cell(status: dict) -> str:
    parts = [f"{(text or '(no status)').replace('|', '/')}: {n}" for text, n in status["top"]]
    if status["other"]:
        parts.append(f"{status['distinct'] - len(status['top'])} others: {status['other']}")
    return "; ".join(parts) or "-"


def format_status_table(result: dict) -> list[str]:
    """Markdown lines of the table "HybridStep status by method" (and the fault drill)."""
    fault = (result.get("setup") or {}).get("retrieval_fault") or "none"
    vs_drafter = rate_vs_drafter(result["methods"])
    lines = ["", "### HybridStep status by method", ""]
    if fault != "none":
        lines += [f"Retrieval fault drill: `{fault}` for the methods that use retrieval "
                  f"(their in-process phase skipped).", ""]
    lines += ["| method | fault | steps sent | draft source retrieval / drafter / none | "
              "verify-skipped | commands /s (vs drafter) | status: the 4 most common "
              "(digits as N) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["methods"].items():
        steps = r.get("hybrid_steps")
        if r.get("error") or not steps:
            continue
        share = steps["draft_source_share"]
        shares = " / ".join(_f(share[k], ".0%") for k in ("retrieval", "drafter", "none"))
        faulted = r.get("retrieval_fault")
        rate = _f(r["command_rate_hz"], ".2f")
        if name in vs_drafter:
            rate += f" ({_f(vs_drafter[name], '.2f')})"
        lines.append(f"| {name} | {faulted['how'] if faulted else '-'} | {steps['steps']} | "
                     f"{shares} | {_f(steps['verify_skipped_share'], '.0%')} | {rate} | "
                     f"{_status_cell(steps['status'])} |")
    behind = {n: r["checks_behind"] for n, r in result["methods"].items()
              if r.get("checks_behind")}
    for name, c in behind.items():
        lines += ["", f"Checks behind ({name}): {c['collected']} collected by the sent steps, "
                      f"{c['rejected']} rejected (the next step verified); the step waited for "
                      f"{c['waited']} of them (median {c['wait_ms_p50']:.1f} ms)."]
    return lines



def plot_step_times(raw: dict, path: Path) -> None:
    """Histograms of the step times per method: node (log, HybridStep) vs in-process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in raw if raw[m].get("inprocess")]
    if not methods:
        return
    fig, axes = plt.subplots(len(methods), 1, figsize=(8, 2.6 * len(methods)), squeeze=False)
    for ax, method in zip(axes[:, 0], methods, strict=True):
        phase, inproc = raw[method]["phase"], raw[method]["inprocess"]
        series = {"node: held steps, log (wall)": (phase.get("held_ms", []), "tab:red"),
                  "node: HybridStep.total_ms (sent)": (phase.get("hybrid_total_ms", []),
                                                       "tab:blue"),
                  "in-process (wall)": (inproc.get("wall_ms", []), "tab:green")}
        top = max((max(v) for v, _ in series.values() if v), default=1.0)
        bins = np.linspace(0, top * 1.05, 40)
        for label, (values, colour) in series.items():
            if values:
                ax.hist(values, bins=bins, alpha=0.5, color=colour,
                        label=f"{label} (n={len(values)})")
        ax.set_title(method)
        ax.set_xlabel("step time, ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
