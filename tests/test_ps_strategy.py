"""`PSStrategy` only: placement on parameter devices, replicas, argument
checking and the one-call gradient reduction."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist._tf import device_util

NUM_REPLICAS = 4


def canonical(device: str) -> str:
    return device_util.canonicalize(device)


def build_mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(3),
        ]
    )


def compile_adam(model: keras.Model) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.random((256, 8), dtype=np.float32)
    y = rng.integers(0, 3, size=(256,)).astype(np.int32)
    return x, y


def train_adam_model(strategy, data, steps=1):
    """An MLP compiled with Adam under `strategy`, trained `steps` steps."""
    x, y = data
    with strategy.scope():
        model = build_mlp()
        compile_adam(model)
    model.fit(x[: 64 * steps], y[: 64 * steps], batch_size=64, epochs=1, verbose=0)
    return model


def assert_slots_beside_their_variables(model: keras.Model) -> None:
    optimizer = model.optimizer
    variables = optimizer._trainable_variables
    assert len(variables) == len(model.trainable_variables)
    for slots in (optimizer._momentums, optimizer._velocities):
        assert len(slots) == len(variables)
        for slot, variable in zip(slots, variables, strict=True):
            assert slot.value.device == variable.value.device, (
                f"slot {slot.path} on {slot.value.device}, its variable "
                f"{variable.path} on {variable.value.device}"
            )


# ------------------------------------------------------------- placement


def test_greedy_places_variables_and_slots_on_parameter_devices(cpu_devices, data):
    params = cpu_devices[6:8]
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS], parameter_devices=params, placement="greedy"
    )
    assert strategy.extended.parameter_devices == tuple(canonical(d) for d in params)
    model = train_adam_model(strategy, data)
    report = strategy.extended.placement

    canonical_params = {canonical(d) for d in params}
    rows = report.variables
    assert rows, "nothing was placed"
    assert {row.device for row in rows} <= canonical_params
    # Where the report says is where the variable really is.
    for variable in model.trainable_variables:
        assert canonical(variable.value.device) in canonical_params
    first = model.trainable_variables[0]
    assert first.value.device.endswith(params[0])
    # Greedy spreads the load: both devices hold parameters, balanced to
    # within one variable (plus the 1-byte minimum of empty variables).
    assert {canonical(v.value.device) for v in model.trainable_variables} == (
        canonical_params
    )
    assert all(nbytes > 0 for nbytes in report.bytes_per_device().values())
    policy_rows = [row for row in rows if row.slot_of is None]
    load = dict.fromkeys(canonical_params, 0)
    for row in policy_rows:
        load[row.device] += row.bytes
    assert max(load.values()) - min(load.values()) <= max(
        r.bytes for r in policy_rows
    ) + len(policy_rows)

    # Adam's two slots per variable are reported as slots, beside it.
    slot_rows = [row for row in rows if row.slot_of is not None]
    assert len(slot_rows) == 2 * len(model.trainable_variables)
    assert_slots_beside_their_variables(model)
    assert "optimizer slot variables colocated" in str(report)


def test_round_robin_alternates_parameter_devices(cpu_devices, data):
    params = cpu_devices[6:8]
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        parameter_devices=params,
        placement="round_robin",
    )
    model = train_adam_model(strategy, data)
    policy_rows = [
        r for r in strategy.extended.placement.variables if r.slot_of is None
    ]
    assert len(policy_rows) >= len(model.trainable_variables)
    expected = [canonical(params[i % 2]) for i in range(len(policy_rows))]
    assert [r.device for r in policy_rows] == expected
    # The model's own variables are created first, so they alternate too.
    assert [canonical(v.value.device) for v in model.trainable_variables] == (
        expected[: len(model.trainable_variables)]
    )
    assert_slots_beside_their_variables(model)


def test_callable_placement_policy(cpu_devices, data):
    params = cpu_devices[6:8]
    seen = []

    def biases_apart(name, shape, dtype):
        seen.append((name, shape, dtype))
        return params[1] if "bias" in name else params[0]

    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        parameter_devices=params,
        placement=biases_apart,
    )
    model = train_adam_model(strategy, data)
    assert seen, "the policy was never called"
    for name, shape, dtype in seen:
        assert isinstance(name, str)
        assert isinstance(shape, tf.TensorShape)
        assert isinstance(dtype, tf.DType)
    assert ("kernel", tf.TensorShape([8, 16]), tf.float32) in seen
    for variable in model.trainable_variables:
        want = params[1] if "bias" in variable.path else params[0]
        assert canonical(variable.value.device) == canonical(want), variable.path
    assert_slots_beside_their_variables(model)


def test_registered_placement_policy_by_id_and_config(cpu_devices):
    from keras_psdist import placement
    from keras_psdist.families import PLACEMENTS

    params = cpu_devices[6:8]

    class LastDevice(placement.PlacementPolicy):
        def __call__(self, name, shape, dtype):
            return self.require_devices()[-1]

    placement.register("last_device", LastDevice)
    try:
        for identifier in ("last_device", {"class_name": "last_device"}):
            strategy = kpd.PSStrategy(
                devices=cpu_devices[:NUM_REPLICAS],
                parameter_devices=params,
                placement=identifier,
            )
            with strategy.scope():
                model = build_mlp()
            for variable in model.variables:
                assert canonical(variable.value.device) == canonical(params[1])
    finally:
        PLACEMENTS.unregister("last_device")


def test_placement_callable_returning_non_parameter_device(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        parameter_devices=cpu_devices[6:8],
        placement=lambda name, shape, dtype: cpu_devices[3],
    )
    # Raised when a variable is created, i.e. when the model is built.
    with strategy.scope(), pytest.raises(ValueError, match="not a parameter device"):
        build_mlp()


# --------------------------------------------------------------- replicas


@pytest.mark.parametrize("num_devices", [1, 2, 4])
def test_one_replica_per_device(cpu_devices, num_devices):
    devices = cpu_devices[:num_devices]
    strategy = kpd.PSStrategy(devices=devices)
    assert strategy.num_replicas_in_sync == num_devices
    assert list(strategy.extended.worker_devices) == [canonical(d) for d in devices]

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        return tf.identity(ctx.replica_id_in_sync_group)

    results = strategy.experimental_local_results(strategy.run(replica_fn))
    assert [int(t) for t in results] == list(range(num_devices))
    # Each replica ran on its own compute device.
    assert [canonical(t.device) for t in results] == [canonical(d) for d in devices]


# ---------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"devices": ["/cpu:99"]},
            r"`devices` names devices this process does not have: \['/cpu:99'\]",
        ),
        ({"devices": "/cpu:0"}, r"`devices` must be a list of device names"),
        ({"placement": "nope"}, r"Unknown placement 'nope'.*greedy.*round_robin"),
        (
            {"aggregator": "krumm"},
            r"Unknown aggregator 'krumm'.*Expected one of:.*mean",
        ),
        ({"num_byzantine": -1}, r"num_byzantine.*-1"),
        (
            {"num_byzantine": 1},
            r"`mean` aggregator tolerates no Byzantine.*num_byzantine=1",
        ),
        ({"devices": []}, r"at least one device"),
        ({"devices": ["/cpu:0", "/cpu:0"]}, r"names a device twice"),
        ({"parameter_devices": ["/gpu:7"]}, r"`parameter_devices` names devices"),
    ],
    ids=[
        "unknown-device",
        "devices-string",
        "unknown-placement",
        "unknown-aggregator",
        "negative-byzantine",
        "byzantine-with-mean",
        "devices-empty",
        "devices-duplicate",
        "unknown-parameter-device",
    ],
)
def test_bad_arguments_raise_value_error(cpu_devices, kwargs, message):
    kwargs = {"devices": cpu_devices[:NUM_REPLICAS], **kwargs}
    with pytest.raises(ValueError, match=message):
        kpd.PSStrategy(**kwargs)


def test_model_built_outside_scope(cpu_devices, data):
    x, y = data
    model = build_mlp()  # Variables created with no strategy.
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    with (
        strategy.scope(),
        # At compile, before anything trains on the wrong devices.
        pytest.raises(ValueError, match=r"was created outside `strategy.scope\(\)`"),
    ):
        compile_adam(model)
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)


# -------------------------------------------------------------- reduction


def test_gradients_of_a_step_are_reduced_in_one_call(cpu_devices, data, monkeypatch):
    x, y = data
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    aggregator = strategy.extended.aggregator
    original = aggregator.step
    calls = []

    def spy(reduce_op, per_replica, *args, **kwargs):
        calls.append([len(values) for values in per_replica])
        return original(reduce_op, per_replica, *args, **kwargs)

    monkeypatch.setattr(aggregator, "step", spy)
    with strategy.scope():
        model = build_mlp()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    before = [w.copy() for w in model.get_weights()]
    # 4 full steps of one traced function: calls happen at trace time.
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert not np.allclose(before[0], model.get_weights()[0])
    num_variables = len(model.trainable_variables)
    assert num_variables == 6
    assert calls == [[NUM_REPLICAS] * num_variables], calls


def test_a_metric_variable_reads_as_a_number_summed_over_replicas(cpu_devices):
    # Keras 3.10 reads a metric whose `result()` returns its variable with
    # `float(...)`; TensorFlow's own SyncOnReadVariable refuses that.
    strategy = kpd.PSStrategy(devices=cpu_devices[:2])
    with strategy.scope():
        count = keras.Variable(0.0, synchronization="on_read", aggregation="sum")

    def add_one():
        count.assign_add(1.0)

    strategy.run(add_one)
    assert float(count) == 2.0 and int(count) == 2
    np.testing.assert_array_equal(np.asarray(count), 2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="on-parameter-devices"),
        pytest.param({"dense": "all_reduce"}, id="replicated"),
        pytest.param(
            {"partitioner": kpd.partitioners.Fixed(2, min_variable_bytes=0)},
            id="partitioned",
        ),
    ],
)
def test_every_kind_of_variable_converts_to_numpy_without_warnings(cpu_devices, kwargs):
    """Keras reads values with `np.array(x)`, which numpy 2 calls with `copy`:
    an `__array__` without it (TensorFlow's) makes numpy warn."""
    import warnings

    strategy = kpd.PSStrategy(devices=cpu_devices[:2], **kwargs)
    with strategy.scope():
        layer = keras.layers.Dense(3)
        layer.build((None, 4))
        count = keras.Variable(0.0, synchronization="on_read", aggregation="sum")
    # Ours, under Keras's wrappers (whose own `__array__` is Keras's).
    variables = [v.value for v in [*layer.weights, count]]
    kinds = {type(v).__name__ for v in variables}
    assert len(kinds) == 2 and "ReplicaLocalVariable" in kinds, kinds
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for variable in variables:
            for read in (np.array, np.asarray):
                value = read(variable)
                assert value.shape == tuple(variable.shape), type(variable)
                assert read(variable, dtype=np.float64).dtype == np.float64
