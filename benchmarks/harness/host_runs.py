"""One benchmark run on separate hosts (network namespaces): `run_once`
launches a script's children, one task per host, and summarizes their
reports with what the hosts' counters and processes say.

Shared by `scaling.py` (its sweeps) and `plan_check.py` (the planner's
validation), which both run `scaling.py`'s children (`--role KIND`); the
script's path is an argument, so neither script imports the other.
Imports TensorFlow only through `keras_psdist` inside `run_once`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import progress, tf_keras_ps
from .processes import tail

RUN_TIMEOUT_S = 900.0


class _Sampler(threading.Thread):
    """While a run goes: each ps host's peak RSS, and the link counters and
    /proc/stat at the timed window's marks (files the first worker writes)."""

    def __init__(self, hosts, out: Path, ps_hosts: list[str]):
        super().__init__(daemon=True)
        self.hosts, self.out, self.ps_hosts = hosts, out, ps_hosts
        self.peak_rss = dict.fromkeys(ps_hosts, 0)
        self.marks: dict[str, dict] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            for mark in ("timed_begin", "timed_end"):
                if mark not in self.marks and (self.out / mark).exists():
                    self.marks[mark] = {
                        "counters": {
                            h: vars(self.hosts.counters(h)) for h in self.hosts.names
                        },
                        "cpu": _cpu_times(),
                        "host_cpu_s": {
                            h: _host_cpu_s(self.hosts, h) for h in self.hosts.names
                        },
                    }
            for host in self.ps_hosts:
                self.peak_rss[host] = max(self.peak_rss[host], _rss(self.hosts, host))


def _pids(hosts, host: str) -> list[str]:
    return subprocess.run(
        ["ip", "netns", "pids", hosts.namespace(host)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()


def _host_cpu_s(hosts, host: str) -> float:
    """CPU seconds (user + system, every thread) of the processes on `host`."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _pids(hosts, host):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _rss(hosts, host: str) -> int:
    total = 0
    for pid in _pids(hosts, host):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(match.group(1)) * 1024 if match else 0
    return total


def _cpu_times() -> list[int]:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return [int(f) for f in fields]


def _busy_fraction(begin: list[int], end: list[int]) -> float:
    delta = [e - b for b, e in zip(begin, end, strict=True)]
    idle = delta[3] + delta[4]  # idle + iowait
    return 1.0 - idle / max(1, sum(delta))


def run_once(
    script: Path, kind: str, workers: int, num_ps: int, args, work: Path, **extra
) -> dict:
    """One launch of `script --role KIND ...` on fresh hosts; returns the
    run's summary (or its error)."""
    from keras_psdist.cluster.launcher.run import launch
    from keras_psdist.testing.hosts import NamespaceHosts, one_host_per_task

    chief = kind in ("in-graph", "tf_keras")
    placement = one_host_per_task(num_ps, workers, chief=chief)
    out = Path(tempfile.mkdtemp(prefix=f"{kind}-w{workers}-p{num_ps}-", dir=work))
    log_path = out / "launch.log"
    mbit = extra.get("mbit")
    rows = extra.get("rows", 0)
    slow_mbit = extra.get("slow_mbit")  # The last worker's link alone.
    hidden = extra.get("hidden", getattr(args, "hidden", 512))
    compression = extra.get("compression", "none")
    command = [
        sys.executable, str(script), "--role", kind,
        "--out-dir", str(out), "--workers", str(workers), "--num-ps", str(num_ps),
        "--steps", str(extra.get("steps", args.steps)), "--epochs", str(args.epochs),
        "--batch", str(args.batch), "--seed", str(args.seed), "--rows", str(rows or 1),
        "--steps-per-execution", str(args.steps_per_execution),
        "--hidden", str(hidden), "--compression", compression,
    ]  # fmt: skip
    if getattr(args, "depth", None):
        command += ["--depth", str(args.depth)]
    entry = {
        "kind": kind,
        "workers": workers,
        "num_ps": num_ps,
        "mbit": mbit,
        "rows": rows,
        "slow_mbit": slow_mbit,
        "compression": compression,
    }
    progress.log(
        f"{kind}: {workers} workers, {num_ps} ps, mbit {mbit}, rows {rows}, "
        f"last worker's link {slow_mbit or 'unlimited'}, compression {compression}"
    )
    with NamespaceHosts(list(dict.fromkeys(placement.values()))) as hosts:
        if mbit:
            for host in hosts.names:
                hosts.limit(host, mbit)
        if slow_mbit:
            hosts.limit(placement[f"worker:{workers - 1}"], slow_mbit)
        ps_hosts = [placement[f"ps:{i}"] for i in range(num_ps)]
        sampler = _Sampler(hosts, out, ps_hosts)
        sampler.start()
        servers = (
            tf_keras_ps.tensorflow_default_servers()
            if kind == "tf_keras"
            else contextlib.nullcontext()
        )
        with open(log_path, "w") as log, servers:
            code = launch(
                command,
                num_ps=num_ps,
                num_workers=workers,
                mode="in-graph" if chief else "between-graph",
                hosts=hosts.task_hosts(placement),
                timeout_s=RUN_TIMEOUT_S,
                out=log,
            )
        sampler.stop.set()
        sampler.join()
    if code != 0:
        entry["error"] = {"code": code, "log_tail": tail(log_path, 40)}
        progress.log(f"  failed (exit {code}); log {log_path}")
        return entry
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*_[0-9]*.json"))]
    entry.update(_summarize_run(kind, reports, sampler, placement))
    progress.log(
        f"  {entry['examples_per_s']:.0f} examples/s, "
        f"{entry['updates_per_s']:.1f} updates/s, "
        f"machine busy {entry['machine_busy']:.2f}"
    )
    return entry


def _summarize_run(kind, reports, sampler, placement: dict[str, str]) -> dict:
    ps_hosts = [h for task, h in placement.items() if task.startswith("ps:")]
    if kind == "sync-backup":
        return _summarize_backup_run(reports)
    start = min(r["start_wall"] for r in reports)
    end = max(r["end_wall"] for r in reports)
    wall = end - start
    examples = sum(r["examples"] for r in reports)
    first = next(r for r in reports if r["worker_index"] == 0)
    if kind in ("async", "embedding"):
        updates = sum(r["steps"] for r in reports)
    else:
        updates = first["iterations"][1] - first["iterations"][0]
    summary = {
        "wall_s": wall,
        "examples_per_s": examples / wall,
        "updates_per_s": updates / wall,
        "updates": updates,
        "cpu_fraction": {
            r["task"]: r["cpu_s"] / (r["end_wall"] - r["start_wall"])
            for r in reports
            if r["cpu_s"] is not None
        },
        "peak_rss_mb": {h: rss / 2**20 for h, rss in sampler.peak_rss.items()},
    }
    marks = sampler.marks
    if {"timed_begin", "timed_end"} <= set(marks):
        begin, finish = marks["timed_begin"], marks["timed_end"]
        summary["machine_busy"] = _busy_fraction(begin["cpu"], finish["cpu"])
        ps_bytes = sum(
            finish["counters"][h]["rx_bytes"]
            + finish["counters"][h]["tx_bytes"]
            - begin["counters"][h]["rx_bytes"]
            - begin["counters"][h]["tx_bytes"]
            for h in ps_hosts
        )
        summary["ps_link_bytes_per_update"] = ps_bytes / max(1, updates)
        summary.update(
            _cpu_per_update(kind, reports, begin, finish, placement, updates)
        )
    else:
        summary["machine_busy"] = float("nan")
    return summary


def _cpu_per_update(kind, reports, begin, finish, placement, updates) -> dict:
    """CPU ms of the ps tasks per update, of the workers per worker step
    (one batch of `--batch` examples), and of the chief (in-graph's, or
    tf_keras's coordinator) per update, over the timed window, from each
    host's processes."""
    if "host_cpu_s" not in begin:
        return {}

    def cpu_s(role: str) -> float:
        return sum(
            finish["host_cpu_s"][h] - begin["host_cpu_s"][h]
            for task, h in placement.items()
            if task.startswith(role + ":")
        )

    workers = sum(task.startswith("worker:") for task in placement)
    if kind in ("async", "tf_keras", "embedding"):
        worker_steps = updates  # One update per worker step.
    else:  # sync, in-graph: every update takes one step of each worker.
        worker_steps = updates * workers
    costs = {
        "ps_cpu_ms_per_update": cpu_s("ps") / max(1, updates) * 1e3,
        "worker_cpu_ms_per_step": cpu_s("worker") / max(1, worker_steps) * 1e3,
    }
    if any(task.startswith("chief:") for task in placement):
        costs["chief_cpu_ms_per_update"] = cpu_s("chief") / max(1, updates) * 1e3
    return costs


def _summarize_backup_run(reports) -> dict:
    """A sync run with a backup worker: the chief's update rate over its
    timed window, and the whole job, from the first `fit`'s start to the
    last process's end (a straggler that runs on after the chief counts)."""
    chief = next(r for r in reports if r["worker_index"] == 0)
    updates = chief["iterations"][1] - chief["iterations"][0]
    window = chief["end_wall"] - chief["start_wall"]
    job = max(r["exit_wall"] for r in reports) - min(
        r["fit_start_wall"] for r in reports
    )
    return {
        "updates": updates,
        "updates_per_s": updates / window,
        "examples_per_s": chief["examples"] / window,
        "job_s": job,
        "chief_fit_s": chief["exit_wall"] - chief["fit_start_wall"],
        "machine_busy": float("nan"),
    }
