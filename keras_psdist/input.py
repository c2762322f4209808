"""Input pipelines of a PSStrategy: where each replica's batches come from.

| topology   | pipelines                                                          |
|------------|--------------------------------------------------------------------|
| one host   | one, on the host, split into the replicas' batches (as TF does)    |
| in-graph   | one per worker task, on that worker: each runs the user's pipeline |
|            | and keeps its replicas' batches, so the data never passes through  |
|            | the chief and every replica gets the batch it gets on one host     |
| async      | one, on this worker: with W workers of R replicas, each global     |
|            | batch is cut into W * R pieces and worker i keeps pieces           |
|            | [i * R, (i + 1) * R), so an epoch is one pass over the data in     |
|            | total and Keras's step count per epoch is right on every worker   |

On one host, a global batch of B examples is cut into the replicas' batches by
`tf.data`'s rebatch (sizes differing by at most one, in replica order). An
in-graph or async worker cuts every global batch the same way and keeps its
own replicas' pieces, which is what makes an in-graph run equal a one-host run
with the same replicas, and gives async workers disjoint data. Each in-graph
worker reads the whole input for that, and the pipeline must be one
TensorFlow can send to another process (tensors, files): one built on Python
code (`from_generator`, a `PyDataset`) is refused with the fix.
"""

from __future__ import annotations

import tensorflow as tf

from keras_psdist._tf import (
    data_distribute,
    distribute_lib,
    input_lib,
    input_util,
)
from keras_psdist.cluster.runtime import Topology


class InputPipelines:
    """Builds the distributed datasets of one strategy.

    Args:
        strategy: The `PSStrategy`.
        topology: Its devices (see `keras_psdist.cluster.runtime`).
    """

    def __init__(self, strategy: tf.distribute.Strategy, topology: Topology):
        self._strategy = strategy
        self._topology = topology
        self._num_replicas = len(topology.compute_devices)

    def input_workers(self, options=None) -> input_lib.InputWorkers:
        """The `(host, devices)` pairs: to device, or kept on the host."""
        pairs = self._topology.input_workers
        if options and not options.experimental_fetch_to_device:
            pairs = [(host, (host,) * len(devices)) for host, devices in pairs]
        return input_lib.InputWorkers(list(pairs))

    def distribute_dataset(self, dataset: tf.data.Dataset, options):
        """`strategy.experimental_distribute_dataset` (see the module docstring)."""
        topology = self._topology
        n = self._num_replicas
        if topology.mode == "async" and topology.num_training_processes > 1:
            # This worker's replicas are replicas [first, first + n) of all
            # the training processes' replicas.
            first = topology.worker_index * n
            total = topology.num_training_processes * n
            return self._pieces_of_global_batches(
                [dataset], [(first, first + n)], total, options
            )
        if len(topology.input_workers) > 1:
            clones = self._clone_to_workers(dataset)
            ranges, start = [], 0
            for _, devices in topology.input_workers:
                ranges.append((start, start + len(devices)))
                start += len(devices)
            return self._pieces_of_global_batches(clones, ranges, n, options)
        return input_util.get_distributed_dataset(
            dataset,
            self.input_workers(options),
            self._strategy,
            num_replicas_in_sync=n,
            options=options,
        )

    def distribute_datasets_from_function(self, dataset_fn, options):
        """`strategy.distribute_datasets_from_function`: `dataset_fn` runs once
        per pipeline, with an `InputContext` naming the pipeline; in async mode
        a pipeline is a training process."""
        topology = self._topology
        workers = self.input_workers(options)
        if topology.mode == "async":
            count = topology.num_training_processes
        else:
            count = len(topology.input_workers)
        first = self._first_pipeline_id()
        contexts = [
            distribute_lib.InputContext(
                num_input_pipelines=count,
                input_pipeline_id=first + i,
                num_replicas_in_sync=self._num_replicas,
            )
            for i in range(workers.num_workers)
        ]
        return input_util.get_distributed_datasets_from_function(
            dataset_fn, workers, contexts, self._strategy, options=options
        )

    def _clone_to_workers(self, dataset):
        """The dataset re-created on each worker task."""
        hosts = [host for host, _ in self._topology.input_workers]
        try:
            clones = data_distribute.replicate(dataset, hosts)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            raise ValueError(
                "In-graph training runs the input pipeline on every worker task, "
                "and this one cannot be sent to them: it is built on Python code "
                "(`Dataset.from_generator`, a `keras.utils.PyDataset`, "
                "`py_function`) that exists only in this process. Build it from "
                "tensors or files (`tf.data.Dataset.from_tensor_slices`, "
                "`TFRecordDataset`), or use PSStrategy(mode='async'), where every "
                f"worker runs its own pipeline. TensorFlow said: {e}"
            ) from None
        return [clones[host] for host in hosts]

    def _pieces_of_global_batches(self, datasets, ranges, total, options):
        """Pipeline i cuts every global batch of `datasets[i]` into `total`
        replica batches and keeps those of replicas `ranges[i]`."""

        def dataset_fn(context):
            index = context.input_pipeline_id - self._first_pipeline_id()
            low, high = ranges[index]
            pieces = replica_batches(datasets[index], total)
            mine = pieces.enumerate().filter(
                lambda i, _: tf.logical_and(i % total >= low, i % total < high)
            )
            return mine.map(lambda _, element: element).prefetch(high - low)

        return self.distribute_datasets_from_function(dataset_fn, options)

    def _first_pipeline_id(self):
        topology = self._topology
        return topology.worker_index if topology.mode == "async" else 0


def replica_batches(dataset: tf.data.Dataset, num_replicas: int) -> tf.data.Dataset:
    """Cuts each global batch into `num_replicas` consecutive pieces, as
    `tf.distribute` does on one host (`tf.data`'s rebatch)."""
    with tf.device(dataset._variant_tensor.device):  # noqa: SLF001
        batch_size = data_distribute.compute_batch_size(dataset)

        def rebatch():
            sizes = data_distribute.batch_sizes_for_worker(
                batch_size, 1, num_replicas, 0
            )
            return dataset.rebatch(sizes)

        def legacy_rebatch():
            return data_distribute._LegacyRebatchDataset(dataset, num_replicas)  # noqa: SLF001

        return tf.cond(tf.not_equal(batch_size, -1), rebatch, legacy_rebatch)
