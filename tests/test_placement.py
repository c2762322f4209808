"""Placement policies and the placement report, without a strategy."""

import numpy as np
import pytest
import tensorflow as tf

from keras_psdist import placement
from keras_psdist.families import PLACEMENTS

DEVICES = ["/cpu:0", "/cpu:1", "/cpu:2"]


def test_greedy_balances_bytes():
    policy = placement.get_policy("greedy", DEVICES)
    sizes = [1000, 10, 10, 500, 400, 90, 5]
    load = dict.fromkeys(DEVICES, 0)
    for i, size in enumerate(sizes):
        device = policy(f"v{i}", tf.TensorShape([size]), tf.float32)
        load[device] += size * 4
    # The 1000-element variable lands alone; the rest fill the lighter devices.
    assert load == {"/cpu:0": 4000, "/cpu:1": 40 + 2000, "/cpu:2": 40 + 1600 + 360 + 20}


def test_greedy_picks_least_loaded_device():
    policy = placement.get_policy("greedy", DEVICES)
    assert policy("a", tf.TensorShape([100]), tf.float32) == "/cpu:0"
    assert policy("b", tf.TensorShape([50]), tf.float32) == "/cpu:1"
    assert policy("c", tf.TensorShape([10]), tf.float32) == "/cpu:2"
    assert policy("d", tf.TensorShape([10]), tf.float32) == "/cpu:2"
    assert policy("e", tf.TensorShape([10]), tf.float32) == "/cpu:2"
    assert policy("f", tf.TensorShape([10]), tf.float32) == "/cpu:2"
    assert policy("g", tf.TensorShape([10]), tf.float32) == "/cpu:2"  # 160 < 200
    assert policy("h", tf.TensorShape([10]), tf.float32) == "/cpu:1"  # tie: first


def test_round_robin_cycles():
    policy = placement.get_policy("round_robin", DEVICES)
    got = [policy(str(i), tf.TensorShape([1]), tf.float32) for i in range(5)]
    assert got == ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:0", "/cpu:1"]


def test_callable_is_used_as_is():
    def fn(name, shape, dtype):
        return "/cpu:2"

    assert placement.get_policy(fn, DEVICES) is fn


def test_unknown_policy():
    with pytest.raises(
        ValueError, match=r"Unknown placement 'nope'.*greedy, round_robin"
    ):
        placement.get_policy("nope", DEVICES)


def test_policies_by_id_config_or_instance_bind_to_the_devices():
    for identifier in ("round_robin", {"class_name": "round_robin"}):
        policy = placement.get_policy(identifier, DEVICES)
        assert isinstance(policy, placement.RoundRobinPlacement)
        assert policy.devices == tuple(DEVICES)
    unbound = placement.GreedyPlacement()
    first = placement.get_policy(unbound, DEVICES)
    second = placement.get_policy(unbound, DEVICES[:2])
    # Each strategy gets its own policy, with its own load.
    assert first is not second and unbound.devices is None
    assert first("a", tf.TensorShape([100]), tf.float32) == "/cpu:0"
    assert second("a", tf.TensorShape([100]), tf.float32) == "/cpu:0"
    # Built with its devices, a policy is used as it is.
    bound = placement.GreedyPlacement(DEVICES)
    assert placement.get_policy(bound, ["/cpu:5"]) is bound


def test_policies_serialize_without_their_devices():
    policy = placement.get_policy("greedy", DEVICES)
    config = placement.serialize(policy)
    assert config == {"class_name": "greedy", "config": {}}
    restored = placement.deserialize(config)
    assert isinstance(restored, placement.GreedyPlacement)
    assert restored.devices is None
    assert placement.names() == ["greedy", "round_robin"]
    assert placement.GreedyPlacement.name == "greedy"


def test_an_unbound_policy_says_how_to_bind_it():
    with pytest.raises(ValueError, match=r"no devices to place on.*bind\(devices\)"):
        placement.GreedyPlacement()("a", tf.TensorShape([1]), tf.float32)


def test_a_registered_policy_is_found_by_its_id():
    class Last(placement.PlacementPolicy):
        def __init__(self, devices=None, skip=0):
            super().__init__(devices)
            self.skip = skip

        def __call__(self, name, shape, dtype):
            return self.require_devices()[-1 - self.skip]

        def get_config(self):
            return {"skip": self.skip}

    placement.register("last", Last)
    try:
        policy = placement.get_policy(
            {"class_name": "last", "config": {"skip": 1}}, DEVICES
        )
        assert policy("v", tf.TensorShape([1]), tf.float32) == "/cpu:1"
        assert placement.serialize(policy) == {
            "class_name": "last",
            "config": {"skip": 1},
        }
        with pytest.raises(ValueError, match="Unknown placement 'lats'.*'last'"):
            placement.get_policy("lats", DEVICES)
    finally:
        PLACEMENTS.unregister("last")
    assert "last" not in placement.names()


@pytest.mark.parametrize(
    "identifier, message",
    [
        (placement.GreedyPlacement, r"the class GreedyPlacement.*placement='greedy'"),
        ({"class_name": "greedy", "config": {"load": 1}}, "unknown argument 'load'"),
        ({"name": "greedy"}, "'class_name' and 'config'"),
        (3, r"Could not interpret placement 3.*callable"),
    ],
)
def test_bad_policy_identifiers_say_what_is_accepted(identifier, message):
    with pytest.raises(ValueError, match=message):
        placement.get_policy(identifier, DEVICES)


def test_variable_bytes():
    assert placement.variable_bytes(tf.TensorShape([3, 4]), tf.float16) == 24
    assert placement.variable_bytes(tf.TensorShape([None, 4]), tf.float32) == 0


def test_report_table_and_totals():
    report = placement.Placement(DEVICES[:2])
    report.record(
        placement.PlacedVariable("dense/kernel", "/cpu:0", (4, 2), "float32", 32)
    )
    report.record(
        placement.PlacedVariable("m", "/cpu:0", (4, 2), "float32", 32, "dense/kernel")
    )
    report.record(placement.PlacedVariable("dense/bias", "/cpu:1", (2,), "float32", 8))
    assert report.bytes_per_device() == {"/cpu:0": 64, "/cpu:1": 8}
    assert report.device_of("dense/bias") == "/cpu:1"
    text = str(report)
    assert "dense/kernel" in text and "4x2" in text
    assert "1 optimizer slot variables" in text
    with pytest.raises(KeyError, match="No variable named 'x'"):
        report.device_of("x")


def test_per_variable_rule_spreads_gradients_over_parameter_devices(cpu_devices):
    """The mean combines each variable's gradients on one parameter device,
    balanced by bytes, instead of sending every gradient to one device."""
    from keras_psdist import aggregators
    from keras_psdist.distribute.reduction import GradientReduction

    devices = [tf.config.list_logical_devices("CPU")[i].name for i in (2, 3)]
    reduction = GradientReduction(
        aggregators.get("mean").bind(2, 0),
        None,
        devices[0],
        2,
        spread_devices=devices,
    )
    columns = [
        [tf.fill([1000], float(r + 1)) for r in range(2)],
        [tf.fill([10], float(r + 3)) for r in range(2)],
        [tf.fill([600], float(r + 5)) for r in range(2)],
    ]
    out = reduction(tf.distribute.ReduceOp.MEAN, columns, None)
    for o, c in zip(out, columns, strict=True):
        np.testing.assert_allclose(o.numpy(), (c[0].numpy() + c[1].numpy()) / 2)
    where = [o.device.split("/")[-1] for o in out]
    # The largest goes to one device, the next two to the other.
    assert where[0] != where[2] and where[1] == where[2], where
