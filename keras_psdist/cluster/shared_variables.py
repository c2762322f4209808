"""Variables shared by every worker process of a between-graph run.

In async (between-graph) training each worker runs the same script in its own
process, so each builds the same model. For the workers to train one model,
each variable must be one resource on a ps task, not one per process.
TensorFlow shares a resource between clients that open it by the same
`shared_name` and `container` on the same device; eager `tf.Variable`s are
always anonymous, so the handle is opened with the raw `VarHandleOp` and
wrapped in a `BaseResourceVariable`, without the deleter an eager variable
gets (a worker that exits must not destroy the model for the others).

The chief initialises each variable, once: if the variable already holds a
value (the chief restarted while the ps tasks kept running), it is kept. The
other workers wait until the chief has done so. A process that opens a
variable someone else created checks its shape: a worker that builds another
model (other arguments, another script) gets a `ValueError` naming the
variable and both shapes, not an obscure failure in its first step.

Names: a variable's shared name is its name (Keras's path, e.g.
`sequential/dense/kernel`), plus `_2`, `_3`, ... for the second and later
variables of one name in a process. Workers running the same script create
their variables in the same order, so the names agree. A run's own state
(sync counters, queues, staleness clocks) goes under `run_namespace`, so a
second strategy of the script starts afresh.
"""

from __future__ import annotations

import collections
import itertools
import time

import tensorflow as tf

from keras_psdist._tf import handle_data_util, resource_variable_ops

_POLL_SECONDS = 0.1
_unique_ids = itertools.count()
# How many runs of each kind this process has started (`run_namespace`).
_runs: collections.Counter[str] = collections.Counter()


def run_namespace(kind: str) -> str:
    """The shared names' prefix for this process's next run of `kind`.

    A run's own state on the ps tasks (a sync run's step count and queues,
    bounded staleness's clocks) is named under it: `keras_psdist/<kind>` for
    the script's first run of that kind, `keras_psdist/<kind>_2` for its
    second, and so on. Every process of a between-graph run runs the same
    script, so the k-th run of each process is the same run.
    """
    _runs[kind] += 1
    count = _runs[kind]
    return f"keras_psdist/{kind}" if count == 1 else f"keras_psdist/{kind}_{count}"


class SharedVariables:
    """Creates (chief) or opens (other workers) variables on ps tasks.

    Args:
        is_chief: Whether this process initialises the variables.
        chief: How to name the chief in messages, e.g. `"worker:0"`.
        init_timeout: Seconds a non-chief waits for each variable's value.
        container: The resource container on the ps tasks.
    """

    def __init__(
        self,
        is_chief: bool,
        chief: str,
        init_timeout: float,
        container: str = "keras_psdist",
    ):
        self._is_chief = is_chief
        self._chief = chief
        self._init_timeout = init_timeout
        self._container = container
        self._name_counts: collections.Counter[str] = collections.Counter()

    def create(
        self,
        device: str,
        initial_value,
        shape: tf.TensorShape,
        dtype: tf.DType,
        name: str,
        trainable: bool | None = None,
        **kwargs,
    ) -> tf.Variable:
        """The shared variable `name` on `device`, initialised or waited for."""
        self._name_counts[name] += 1
        count = self._name_counts[name]
        shared_name = name if count == 1 else f"{name}_{count}"
        with tf.init_scope(), tf.device(None), tf.device(device):
            handle = resource_variable_ops.gen_resource_variable_ops.var_handle_op(
                shape=shape,
                dtype=dtype,
                shared_name=shared_name,
                container=self._container,
                name=name.replace("/", "_"),
            )
            handle_data_util.set_handle_data(
                handle, handle_data_util.create_handle_data(shape, dtype)
            )
            variable = resource_variable_ops.BaseResourceVariable(
                trainable=trainable,
                shape=shape,
                dtype=dtype,
                handle=handle,
                synchronization=kwargs.get("synchronization"),
                aggregation=kwargs.get("aggregation"),
                constraint=kwargs.get("constraint"),
                name=name,
                unique_id=f"{shared_name}_{next(_unique_ids)}",
                handle_name=name,
                in_graph_mode=False,
            )
            if self._is_chief:
                if not _is_initialized(handle):
                    variable.assign(
                        tf.cast(tf.convert_to_tensor(initial_value), dtype),
                        read_value=False,
                    )
                    # The remote write is sent without waiting for it, and a
                    # function that writes the variable next can land first
                    # (then be overwritten): wait for the value, as
                    # `keras_psdist.devices.device_variable` does (the race
                    # and its measure are there; `tests/test_remote_init.py`).
                    _is_initialized(handle)
                    return variable
            else:
                self._wait_for_value(handle, shared_name, device)
            self._check_shape(handle, shape, shared_name, device)
        return variable

    def create_int64(self, device: str, name: str, initial_value) -> tf.Variable:
        """A shared int64 bookkeeping variable (a step, counts, clocks)."""
        value = tf.constant(initial_value, tf.int64)
        return self.create(
            device,
            initial_value=value,
            shape=value.shape,
            dtype=tf.int64,
            name=name,
            trainable=False,
        )

    def critical_section(self, device: str, name: str) -> tf.CriticalSection:
        """A shared mutex on `device` (a `tf.CriticalSection`): every process
        that opens `name` in this container locks the same one."""
        with tf.init_scope(), tf.device(None), tf.device(device):
            return tf.CriticalSection(shared_name=f"{self._container}/{name}")

    def _check_shape(self, handle, shape, shared_name, device):
        """The variable another process created must have this one's shape."""
        held = tf.TensorShape(
            tf.raw_ops.VariableShape(input=handle, out_type=tf.int64).numpy().tolist()
        )
        if held == tf.TensorShape(shape):
            return
        who = "this process, the chief," if self._is_chief else "this process"
        raise ValueError(
            f"Shared variable {shared_name!r} on {device}: {who} builds it with "
            f"shape {tuple(tf.TensorShape(shape).as_list())}, but the ps task holds "
            f"it with shape {tuple(held.as_list())} (as the chief, {self._chief}, "
            "created it). Every process of a between-graph run must build the same "
            "model: run the same script with the same arguments on every worker. "
            "If the ps tasks kept running from an earlier run with another model, "
            "restart them too."
        )

    def _wait_for_value(self, handle, shared_name, device):
        deadline = time.monotonic() + self._init_timeout
        while not _is_initialized(handle):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Waited {self._init_timeout:g} s for the chief "
                    f"({self._chief}) to initialise variable {shared_name!r} on "
                    f"{device}. Is the chief running the same script? If it "
                    "is just slow to start, raise PSStrategy(init_timeout=...)."
                )
            time.sleep(_POLL_SECONDS)


def _is_initialized(handle) -> bool:
    return bool(
        resource_variable_ops.gen_resource_variable_ops.var_is_initialized_op(
            handle
        ).numpy()
    )
