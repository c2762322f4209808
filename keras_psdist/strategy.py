"""`PSStrategy`: the public front of the parameter-server strategy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_psdist import aggregators as aggregators_lib
from keras_psdist import devices as devices_lib
from keras_psdist import placement as placement_lib
from keras_psdist._tf import distribute_lib
from keras_psdist.extended import PSExtended


class PSStrategy(distribute_lib.Strategy):
    """Parameter-server data parallelism for Keras 3 `model.fit`.

    Replicas run on the compute devices; every variable lives once, on a
    parameter device chosen by a placement policy, with its optimizer slots
    beside it. Each step, the replicas' gradients are combined by an
    aggregator on a parameter device, and the optimizer updates each variable
    where it lives.

    Swapping it for `tf.distribute.MirroredStrategy()` in Keras code is a
    one-line change: build and compile the model under `strategy.scope()`,
    then call `fit` / `evaluate` / `predict` as usual.

    Args:
        devices: Compute devices, one replica each. Defaults to every local
            GPU; with no GPU, every logical CPU device (one unless the CPU was
            split with `tf.config.set_logical_device_configuration`).
        parameter_devices: Devices that hold variables. Defaults to the host
            CPU, or to the GPU when there is exactly one compute GPU.
        placement: `"greedy"` (the least-loaded parameter device by bytes, as
            AutoDist's load balancer), `"round_robin"` (as TF1's
            `replica_device_setter`), or a callable
            `(name, shape, dtype) -> device` returning one of
            `parameter_devices`. Defaults to `"greedy"`.
        aggregator: How per-replica gradients become one: a string id, a
            config dict or a `keras_psdist.aggregators.Aggregator`. Defaults
            to `"mean"`.
        num_byzantine: How many replicas may be faulty (the papers' *f*);
            checked against the aggregator when the strategy is built.
            Defaults to 0.

    Raises:
        ValueError: for unknown devices, placement or aggregator names, or an
            aggregator that cannot tolerate `num_byzantine` faulty replicas.

    Examples:

    >>> import keras, keras_psdist as kpd
    >>> strategy = kpd.PSStrategy()
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ...     model.compile(optimizer="sgd", loss="mse")
    >>> strategy.extended.placement.device_of("kernel")
    '/job:localhost/replica:0/task:0/device:CPU:0'
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        parameter_devices: Sequence[str] | None = None,
        placement: str | placement_lib.PlacementFn = "greedy",
        aggregator: str | dict[str, Any] | aggregators_lib.Aggregator = "mean",
        num_byzantine: int = 0,
    ):
        if not callable(placement) and placement not in placement_lib.POLICIES:
            raise ValueError(
                f"Unknown placement {placement!r}. Expected one of: "
                f"{', '.join(placement_lib.POLICIES)}, or a callable "
                "(name, shape, dtype) -> device."
            )
        if isinstance(num_byzantine, bool) or not isinstance(num_byzantine, int):
            raise ValueError(
                f"`num_byzantine` must be an int >= 0. Received: num_byzantine={num_byzantine!r}"
            )
        if num_byzantine < 0:
            raise ValueError(
                f"`num_byzantine` must be >= 0. Received: num_byzantine={num_byzantine}"
            )
        aggregator = aggregators_lib.get(aggregator)
        compute = devices_lib.resolve(devices, "devices") or (
            devices_lib.default_compute_devices()
        )
        params = devices_lib.resolve(parameter_devices, "parameter_devices") or (
            devices_lib.default_parameter_devices(compute)
        )
        aggregator.check(len(compute), num_byzantine)
        self._num_byzantine = num_byzantine
        super().__init__(PSExtended(self, compute, params, placement, aggregator))

    @property
    def num_byzantine(self) -> int:
        """The number of replicas the run tolerates as faulty."""
        return self._num_byzantine

    def __repr__(self) -> str:
        ext = self.extended
        return (
            f"PSStrategy(devices={list(ext.worker_devices)}, "
            f"parameter_devices={list(ext.parameter_devices)}, "
            f"aggregator={ext.aggregator!r}, num_byzantine={self._num_byzantine})"
        )
