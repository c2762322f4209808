"""Input pipelines of a PSStrategy: where each replica's batches come from.

| topology      | pipelines                                                          |
|---------------|--------------------------------------------------------------------|
| one host      | one, on the host                                                   |
| in-graph      | one per worker task, on that worker: each runs the user's pipeline |
|               | and keeps its replicas' batches, so the data never passes through  |
|               | the chief and every replica gets the batch it gets on one host     |
| between-graph | one, on this worker: with W workers of R replicas, each global     |
|               | batch is cut into W * R pieces and worker i keeps pieces           |
|               | [i * R, (i + 1) * R), so an epoch is one pass over the data in     |
|               | total and every worker trains on its own examples                  |

A pipeline is the user's dataset of global batches as it is; each global
batch of B examples is cut into the replicas' batches inside the step that
reads it (`pieces.py`, `iterators.py`): consecutive rows in replica order,
sizes differing by at most one, so no replica gets an empty batch while B is
at least the replica count (a partial last batch of 5 on 4 replicas is 2, 1,
1, 1). A between-graph worker skips a global batch too small to reach its pieces.
Cutting the same way everywhere is what makes an in-graph run equal a
one-host run with the same replicas, and gives between-graph workers
disjoint data.
Each in-graph worker reads the whole input for that, and the pipeline must be
one TensorFlow can send to another process (tensors, files): one built on
Python code (`from_generator`, a `PyDataset`) is refused with the fix.

A batch smaller than the replica count still leaves some replicas without
data; `keras_psdist.distribute.replica_batches` gives those a stand-in example whose
every contribution weighs 0, so no kernel runs on an empty batch.

The pipelines are read by plain `tf.data` iterators
(`keras_psdist.distribute.input.iterators`), created each epoch at a single device's
cost.
"""

from __future__ import annotations

import tensorflow as tf

from keras_psdist._tf import (
    data_distribute,
    distribute_lib,
    input_lib,
    nest,
)
from keras_psdist.cluster.runtime import Topology
from keras_psdist.distribute.input.iterators import SplitDataset
from keras_psdist.distribute.input.pieces import Pieces, ReplicaElements


class InputPipelines:
    """Builds the distributed datasets of one strategy.

    Args:
        topology: The strategy's devices (see `keras_psdist.cluster.runtime`).
    """

    def __init__(self, topology: Topology):
        self._topology = topology
        self._num_replicas = len(topology.compute_devices)

    def input_workers(self, options=None) -> input_lib.InputWorkers:
        """The `(host, devices)` pairs: to device, or kept on the host."""
        pairs = self._topology.input_workers
        if options and not options.experimental_fetch_to_device:
            pairs = [(host, (host,) * len(devices)) for host, devices in pairs]
        return input_lib.InputWorkers(list(pairs))

    def distribute_dataset(self, dataset: tf.data.Dataset, options) -> SplitDataset:
        """`strategy.experimental_distribute_dataset` (see the module docstring)."""
        check_batched(dataset)
        topology = self._topology
        n = self._num_replicas
        if topology.between_graph and topology.num_training_processes > 1:
            # This worker's replicas are replicas [first, first + n) of all
            # the training processes' replicas. A batch too small to reach
            # them has nothing for this worker: it skips it.
            first = topology.worker_index * n
            pieces = Pieces(topology.num_training_processes * n, first, first + n)
            if first > 0:
                dataset = dataset.filter(
                    lambda *args: pieces.reaches(_element(dataset, args))
                )
            host = topology.input_workers[0][0]
            return SplitDataset([(host, dataset, pieces)])
        hosts = [host for host, _ in topology.input_workers]
        if len(hosts) > 1:
            clones = self._clone_to_workers(dataset)
        elif hosts[0] != topology.client_device:
            # One worker task: its pipeline runs there when the dataset can
            # be sent to it; one of Python code stays with the caller, and
            # each step's batch comes from there (as one host's would).
            clones = self._clone_to_workers(dataset, or_keep=True)
        else:
            clones = [dataset]
        pipelines, start = [], 0
        for (host, devices), clone in zip(topology.input_workers, clones, strict=True):
            pipelines.append((host, clone, Pieces(n, start, start + len(devices))))
            start += len(devices)
        return SplitDataset(pipelines)

    def distribute_datasets_from_function(self, dataset_fn, options) -> SplitDataset:
        """`strategy.distribute_datasets_from_function`: `dataset_fn` runs once
        per pipeline, on its host, with an `InputContext` naming the pipeline
        (in async mode a pipeline is a training process); each element of
        its dataset is one replica's batch, and a step reads one per replica
        of the pipeline, through the same plain iterators as
        `distribute_dataset`."""
        topology = self._topology
        if topology.between_graph:
            count = topology.num_training_processes
        else:
            count = len(topology.input_workers)
        first = self._first_pipeline_id()
        pipelines = []
        for i, (host, devices) in enumerate(topology.input_workers):
            context = distribute_lib.InputContext(
                num_input_pipelines=count,
                input_pipeline_id=first + i,
                num_replicas_in_sync=self._num_replicas,
            )
            with tf.device(host):
                dataset = dataset_fn(context)
            if not isinstance(dataset, tf.data.Dataset):
                raise TypeError(
                    "`dataset_fn` passed to `distribute_datasets_from_function` "
                    "must return a `tf.data.Dataset` of per-replica batches. "
                    f"Received: {type(dataset).__name__} from input pipeline "
                    f"{first + i}. Return e.g. "
                    "`dataset.batch(context.get_per_replica_batch_size(global_batch))`."
                )
            check_batched(
                dataset,
                "one replica's batch",
                "dataset.batch(context.get_per_replica_batch_size(global_batch_size))",
            )
            pipelines.append((host, dataset, ReplicaElements(len(devices))))
        return SplitDataset(pipelines)

    def _clone_to_workers(self, dataset, or_keep=False):
        """The dataset re-created on each worker task; with `or_keep`, the
        dataset itself when it cannot be."""
        hosts = [host for host, _ in self._topology.input_workers]
        try:
            clones = data_distribute.replicate(dataset, hosts)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            if or_keep:
                return [dataset]
            if "/job:localhost" in str(e) and "unknown device" in str(e):
                raise ValueError(
                    "This dataset was built before the strategy connected to the "
                    "cluster, on the process's local device, which the cluster "
                    "does not know. Build the strategy first, then the dataset "
                    "(`strategy = kpd.PSStrategy(...)` before "
                    f"`tf.data.Dataset...`). TensorFlow said: {e}"
                ) from None
            raise ValueError(
                "In-graph training runs the input pipeline on every worker task, "
                "and this one cannot be sent to them: it is built on Python code "
                "(`Dataset.from_generator`, a `keras.utils.PyDataset`, "
                "`py_function`) that exists only in this process. Build it from "
                "tensors or files (`tf.data.Dataset.from_tensor_slices`, "
                "`TFRecordDataset`), or use PSStrategy(mode='between-graph'), where every "
                f"worker runs its own pipeline. TensorFlow said: {e}"
            ) from None
        return [clones[host] for host in hosts]

    def _first_pipeline_id(self):
        topology = self._topology
        return topology.worker_index if topology.between_graph else 0


def _element(dataset: tf.data.Dataset, args: tuple):
    """A dataset element from the arguments `map`/`filter` functions get."""
    return tf.nest.pack_sequence_as(dataset.element_spec, tf.nest.flatten(args))


def check_batched(
    dataset: tf.data.Dataset,
    element: str = "a global batch",
    fix: str = "dataset.batch(global_batch_size)",
) -> None:
    """Raises `ValueError` unless every component of an element has a batch
    dimension (the global batch is cut into the replicas' batches along it;
    a replica's batch may be cut to zero rows at the end of the data)."""
    spec = dataset.element_spec
    for path, leaf in _paths(spec):
        shape = getattr(leaf, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(
                f"A distributed dataset's elements must each be {element}: "
                "every component needs a leading batch dimension. Received: "
                f"component {path or '(the element)'} of "
                f"shape () in element_spec={spec}. Batch the dataset first, "
                f"e.g. `{fix}`."
            )


def _paths(structure):
    """`(path, leaf)` pairs, e.g. `("0/image", TensorSpec(...))`."""
    return [
        ("/".join(str(p) for p in path), leaf)
        for path, leaf in nest.flatten_with_tuple_paths(structure)
    ]
