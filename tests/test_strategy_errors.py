"""PSStrategy placement on real variables, and bad input caught at build time."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd


def _model():
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(64),
            keras.layers.Dense(32),
            keras.layers.Dense(2),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _fit_once(model):
    x = np.random.rand(16, 8).astype("float32")
    model.fit(x, (x.sum(1) > 4).astype("int32"), batch_size=16, epochs=1, verbose=0)


@pytest.mark.parametrize("placement", ["greedy", "round_robin"])
def test_variables_and_slots_live_on_parameter_devices(cpu_devices, placement):
    params = cpu_devices[6:8]
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], parameter_devices=params, placement=placement
    )
    with strategy.scope():
        model = _model()
    _fit_once(model)
    params = list(strategy.extended.parameter_devices)
    report = strategy.extended.placement
    assert set(report.bytes_per_device()) == set(params)
    assert all(nbytes > 0 for nbytes in report.bytes_per_device().values())
    for variable in model.trainable_variables:
        assert variable.value.device == report.device_of(variable.path)
        assert variable.value.device in params
    slots = [row for row in report.variables if row.slot_of]
    assert len(slots) == 2 * len(model.trainable_variables)  # Adam: m and v
    for slot in slots:
        assert slot.device == report.device_of(slot.slot_of.split(":")[0])
    if placement == "round_robin":
        kernels = [report.device_of(v.path) for v in model.trainable_variables]
        assert kernels[:2] == [params[0], params[1]]


def test_callable_placement_and_replica_count(cpu_devices):
    seen = []

    def policy(name, shape, dtype):
        seen.append((name, tuple(shape), dtype))
        return cpu_devices[7] if "kernel" in name else cpu_devices[6]

    strategy = kpd.PSStrategy(
        devices=cpu_devices[:3], parameter_devices=cpu_devices[6:8], placement=policy
    )
    assert strategy.num_replicas_in_sync == 3
    with strategy.scope():
        model = _model()
    assert ((8, 64), tf.float32) in [(shape, dtype) for _, shape, dtype in seen]
    for variable in model.trainable_variables:
        expected = cpu_devices[7] if "kernel" in variable.path else cpu_devices[6]
        assert variable.value.device.endswith(expected.split("/")[-1])


def test_batch_reduce_to_aggregates_a_whole_step_in_one_call(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:4])
    calls = []
    rule = strategy.extended.aggregator
    original = rule.reduce

    def spy(reduce_op, per_replica, shares=None):
        calls.append(len(per_replica))
        return original(reduce_op, per_replica, shares=shares)

    rule.reduce = spy
    with strategy.scope():
        model = _model()
    _fit_once(model)
    assert calls == [len(model.trainable_variables)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"devices": ["/cpu:99"]}, r"does not have: \['/cpu:99'\]. Available"),
        ({"devices": "/cpu:0"}, r"must be a list of device names.*Did you mean"),
        ({"devices": []}, r"at least one device"),
        ({"devices": ["/cpu:0", "/cpu:0"]}, r"names a device twice"),
        ({"parameter_devices": ["/gpu:7"]}, r"`parameter_devices` names devices"),
        ({"placement": "nope"}, r"Unknown placement 'nope'. Expected one of: greedy"),
        ({"aggregator": "krumm"}, r"Unknown aggregator 'krumm'. Expected one of: mean"),
        ({"num_byzantine": -1}, r"Received: num_byzantine=-1"),
        ({"num_byzantine": 1}, r"tolerates no Byzantine replica"),
    ],
)
def test_bad_arguments_fail_when_the_strategy_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kpd.PSStrategy(**kwargs)


def test_policy_returning_a_foreign_device(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2],
        parameter_devices=cpu_devices[6:8],
        placement=lambda name, shape, dtype: cpu_devices[0],
    )
    with pytest.raises(ValueError, match="is not a parameter device"):
        with strategy.scope():
            _model()


def test_model_built_outside_the_scope(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:2])
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with strategy.scope():
        model.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(
        ValueError, match="was not created under this PSStrategy's scope"
    ):
        _fit_once(model)
