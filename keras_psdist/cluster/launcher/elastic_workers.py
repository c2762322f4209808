"""The workers of an elastic launch (`launch(max_workers=...)`).

A control directory where `add-worker` and `remove-worker-K` files ask for
workers to start and to leave; workers started on hosts that discovery
finds and asked to leave from hosts it loses (`discovery.py`); and, with
`min_workers`, lost workers whose slots are freed. The launch hands it what
it needs: a way to start a training task and one to log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from keras_psdist.cluster.config import (
    CONTROL_DIR_ENV,
    LEAVE_FILE_ENV,
    MAX_WORKERS_ENV,
    ClusterConfig,
)
from keras_psdist.cluster.launcher.discovery import DISCOVERY_EVERY_S
from keras_psdist.cluster.launcher.processes import Child, Stop
from keras_psdist.cluster.launcher.settings import TaskHosts
from keras_psdist.cluster.ports import pick_free_ports


class ElasticWorkers:
    """The control directory of an elastic launch (`max_workers`): starts
    the workers asked for, asks the ones to remove to leave."""

    ADD = "add-worker"
    REMOVE = "remove-worker-"

    def __init__(
        self,
        config: ClusterConfig,
        directory: str,
        *,
        max_workers: int,
        min_workers: int | None,
        discover: Callable[[], list[str]] | None,
        hosts: TaskHosts | None,
        host: str,
        address_host: str,
        spawn: Callable[[ClusterConfig, dict[str, str] | None, bool], Child],
        log: Callable[[str], None],
    ):
        """Says how to add and remove workers.

        Args:
            config: The cluster the launch started with.
            directory: The control directory (removed by the launch).
            max_workers: `launch`'s `max_workers`.
            min_workers: `launch`'s `min_workers`.
            discover: `launch`'s `host_discovery` as a hook, or `None`.
            hosts: `launch`'s `hosts`: where each task runs, or `None`.
            host: `launch`'s `host`, where new workers get free ports.
            address_host: `host` as it goes before `:port`.
            spawn: Runs the training command as a task: `spawn(config, env,
                idle)` adds `env` to its environment and returns its `Child`.
            log: Writes one of the launcher's lines.
        """
        self.config = config
        self.directory = directory
        self.max_workers = max_workers
        self.min_workers = min_workers
        self.discover = discover
        self.hosts = hosts
        self.host = host
        self.address_host = address_host
        self.spawn = spawn
        self.log = log
        self.addresses = list(config.addresses("worker"))
        # Workers asked to leave, and the slots they freed by exiting 0:
        # the next worker added takes the lowest freed slot.
        self.asked: set[int] = set()
        self.freed: set[int] = set()
        # Workers asked for while every slot was taken but some worker was
        # leaving: started once it has exited.
        self.pending = 0
        # Every worker's slot: (its child process, the host it runs on).
        self.running: dict[int, Child] = {}
        self._next_look = 0.0
        self._discovery_failed: str | None = None
        log(
            f"elastic membership (--max-workers {max_workers}): add a "
            f"worker with `touch {self.directory}/{self.ADD}`, remove worker:K "
            f"with `touch {self.directory}/{self.REMOVE}K`."
        )

    def env(self, task: str) -> dict[str, str]:
        """What a training process of `task` (`"worker:K"`) is given."""
        index = task.rsplit(":", 1)[1]
        return {
            CONTROL_DIR_ENV: self.directory,
            MAX_WORKERS_ENV: str(self.max_workers),
            LEAVE_FILE_ENV: os.path.join(self.directory, f"leave-worker-{index}"),
        }

    def check(self, trainers: list[Child], configs: dict) -> None:
        """Acts on the requests in the control directory (each once), and
        on the hosts discovered."""
        for child in trainers:
            index = int(child.name.rsplit(":", 1)[1])
            self.running[index] = child
            if index in self.asked and child.proc.poll() == 0:
                self.asked.discard(index)
                self.freed.add(index)
        while self.pending and (self.freed or len(self.addresses) < self.max_workers):
            self.pending -= 1
            self._add(trainers, configs)
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.startswith(self.ADD):
                os.remove(path)
                self._add(trainers, configs)
            elif name.startswith(self.REMOVE):
                os.remove(path)
                index = name[len(self.REMOVE) :]
                task = f"worker:{index}"
                if task not in configs:
                    self.log(f"remove {task}: no such worker; ignored.")
                    continue
                self._remove(int(index), "")
        if self.discover is not None and time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + DISCOVERY_EVERY_S
            self._follow_hosts(trainers, configs)

    def _training(self) -> list[int]:
        """The slots whose worker trains and was not asked to leave."""
        return sorted(
            index
            for index, child in self.running.items()
            if child.proc.poll() is None and index not in self.asked
        )

    def _remove(self, index: int, why: str) -> bool:
        """Asks `worker:index` to leave after its current step, unless the
        job would then have fewer than `min_workers`."""
        task = f"worker:{index}"
        least = self.min_workers
        if least is not None and len(self._training()) - 1 < least:
            self.log(
                f"remove {task}{why}: the job would have fewer than --min-workers "
                f"{least} workers; it stays."
            )
            return False
        with open(os.path.join(self.directory, f"leave-worker-{index}"), "w"):
            pass
        self.asked.add(index)
        self.log(f"asked {task} to leave after its current step{why}.")
        return True

    def lose(self, child: Child, what: str) -> None:
        """A worker (not the chief) failed, in a job with `min_workers`: it
        is lost and its slot freed, or, with too few left, `Stop`."""
        index = int(child.name.rsplit(":", 1)[1])
        self.running.pop(index, None)
        self.asked.discard(index)
        self.freed.add(index)
        left = len(self._training())
        least = self.min_workers
        if left < least:
            raise Stop(
                1,
                f"{what}; {left} workers are left, fewer than --min-workers "
                f"{least}: stopping every task.",
            )
        self.log(
            f"{what}; lost it, its slot is free, and the job goes on with "
            f"{left} workers (--min-workers {least})."
        )

    def _follow_hosts(self, trainers: list[Child], configs: dict) -> None:
        """Starts workers on hosts that appeared, asks the ones on hosts
        that went to leave (`discovery.py`)."""
        try:
            wanted = self.discover()
        except Exception as e:  # noqa: BLE001 - the job goes on as it is
            if str(e) != self._discovery_failed:
                self.log(f"host discovery failed: {e}; keeping the workers.")
            self._discovery_failed = str(e)
            return
        self._discovery_failed = None
        training = self._training()
        host_of = {i: self.addresses[i].rsplit(":", 1)[0].strip("[]") for i in training}
        for host in dict.fromkeys(host_of.values()):
            on_host = [i for i in training if host_of[i] == host and i != 0]
            excess = sum(h == host for h in host_of.values()) - wanted.count(host)
            for index in sorted(on_host, reverse=True)[: max(0, excess)]:
                self._remove(index, f" ({host} is no longer discovered)")
        for host in dict.fromkeys(wanted):
            missing = wanted.count(host) - sum(h == host for h in host_of.values())
            for _ in range(missing):
                if not self._add(trainers, configs, host=host, quiet=True):
                    return

    def _add(
        self,
        trainers: list[Child],
        configs: dict,
        host: str | None = None,
        quiet: bool = False,
    ) -> bool:
        """Starts a worker in the lowest free slot (on `host`, else the
        launch's); returns whether it did."""
        index = min(self.freed) if self.freed else len(self.addresses)
        if quiet and index >= self.max_workers:
            return False  # Discovery asks again at its next look.
        if index >= self.max_workers and self.asked:
            self.pending += 1
            self.log(
                "add-worker: every slot is taken; starting the worker once a "
                "leaving one has exited."
            )
            return False
        if index >= self.max_workers:
            self.log(
                f"add-worker: the job has its --max-workers "
                f"{self.max_workers} workers already; ignored."
            )
            return False
        task = f"worker:{index}"
        if self.hosts is not None:
            address = self.hosts.address(task)
        elif host is not None:
            port = pick_free_ports(1, host)[0]
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        else:
            port = pick_free_ports(1, self.host)[0]
            address = f"{self.address_host}:{port}"
        if index in self.freed:
            self.freed.discard(index)
            self.addresses[index] = address
            # A new leave file for the slot's new worker.
            leave = os.path.join(self.directory, f"leave-worker-{index}")
            if os.path.exists(leave):
                os.remove(leave)
        else:
            self.addresses.append(address)
        jobs = dict(self.config.jobs)
        jobs["worker"] = tuple(self.addresses)
        config = ClusterConfig(jobs).with_task("worker", index)
        configs[task] = config
        self.log(f"adding {task} at {address}.")
        child = self.spawn(config, self.env(task), False)
        trainers.append(child)
        self.running[index] = child
        return True
