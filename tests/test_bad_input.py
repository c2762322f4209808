"""Bad input over the public surface: a clear `ValueError`, never anything else.

Fuzz-style (hypothesis) for what users write by hand: TF_CONFIG (the messages
for each kind of mistake are checked in test_cluster_config.py), aggregator
and attack config dicts, device lists; targeted tests for what two processes
can disagree on (the model each builds), and for arguments that used to slip
through as another exception or be taken silently (one table, each message
checked for what was received and the fix). Other bad arguments are tested
beside the code they belong to; docs/reliability.md lists them all.
"""

from __future__ import annotations

import inspect
import json
import string
import types

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_psdist as kpd
from keras_psdist import cluster
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.devices import canonical_names
from keras_psdist.families import AGGREGATORS, ATTACKS
from keras_psdist.sync.protocol import SyncConfig
from keras_psdist.sync.training import SyncTraining

# ------------------------------------------------------------------ TF_CONFIG

_WORDS = st.sampled_from(
    ["cluster", "task", "ps", "worker", "chief", "type", "index", "evaluator"]
)
_ADDRESSES = st.one_of(
    st.sampled_from(["127.0.0.1:2222", "localhost:1", "[::1]:3", "h:65535"]),
    st.text(string.printable, max_size=12),
    st.integers(),
)
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.floats(), _ADDRESSES
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_WORDS, st.text(max_size=5)), inner, max_size=4),
    ),
    max_leaves=12,
)


def _plausible_tf_config():
    """Mostly well-formed TF_CONFIGs with one or two things wrong."""
    jobs = st.dictionaries(
        st.one_of(_WORDS, st.text(max_size=4)),
        st.one_of(st.lists(_ADDRESSES, max_size=3), _SCALARS),
        max_size=4,
    )
    task = st.one_of(
        st.none(),
        _SCALARS,
        st.fixed_dictionaries({"type": st.one_of(_WORDS, _SCALARS), "index": _SCALARS}),
    )
    return st.builds(
        lambda c, t, drop_task: (
            {"cluster": c} if drop_task else {"cluster": c, "task": t}
        ),
        jobs,
        task,
        st.booleans(),
    )


def _parse_or_value_error(value) -> None:
    try:
        config = cluster.from_tf_config(value)
    except ValueError as e:
        assert str(e), "an empty error message"
        return
    # Accepted: then it is a consistent cluster.
    assert config.num_ps >= 1 and config.num_workers >= 1
    if config.task_type is not None:
        assert config.task_id < len(config.addresses(config.task_type))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
def test_any_json_value_parses_or_raises_value_error(value):
    _parse_or_value_error(value)
    _parse_or_value_error(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(_plausible_tf_config())
def test_near_miss_tf_configs_parse_or_raise_value_error(value):
    _parse_or_value_error(value)
    _parse_or_value_error(json.dumps(value))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_parses_or_raises_value_error(text):
    _parse_or_value_error(text)


def test_strategies_reject_a_bad_tf_config_from_the_environment(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG", '{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps"}}'
    )
    for make in (kpd.PSStrategy, kpd.SyncReplicaStrategy):
        with pytest.raises(ValueError, match="TF_CONFIG"):
            make()


# ------------------------------------------- processes that build other models


def _shared(is_chief):
    return SharedVariables(is_chief=is_chief, chief="worker:0", init_timeout=5)


def _open(shared, shape, name):
    return shared.create(
        "/cpu:0", tf.zeros(shape), tf.TensorShape(shape), tf.float32, name
    )


def test_a_worker_that_builds_another_shape_is_told_both_shapes():
    # The resources are real (the local device stands in for the ps task);
    # a second SharedVariables plays the other worker process.
    _open(_shared(is_chief=True), [64, 10], "bad_input/dense/kernel")
    with pytest.raises(ValueError) as error:
        _open(_shared(is_chief=False), [64, 12], "bad_input/dense/kernel")
    message = str(error.value)
    assert "'bad_input/dense/kernel'" in message
    assert "shape (64, 12)" in message and "shape (64, 10)" in message
    assert "same script with the same arguments" in message


def test_a_restarted_chief_that_builds_another_model_is_refused():
    # The ps kept the first run's variable; a restarted chief keeps values it
    # finds, but only of the shape it builds.
    _open(_shared(is_chief=True), [8], "bad_input/restarted/bias")
    same = _open(_shared(is_chief=True), [8], "bad_input/restarted/bias")
    assert same.shape == (8,)
    with pytest.raises(ValueError, match=r"shape \(9,\).*shape \(8,\).*restart them"):
        _open(_shared(is_chief=True), [9], "bad_input/restarted/bias")


# ------------------------------------- a sync fit too short to make any update


@pytest.mark.parametrize(
    ("replicas_to_aggregate", "workers", "steps", "refused"),
    [(7, 2, 3, True), (6, 2, 3, False), (2, 2, 1, False), (3, 3, 0, True)],
)
def test_a_sync_fit_that_can_make_no_update_is_refused(
    replicas_to_aggregate, workers, steps, refused
):
    training = types.SimpleNamespace(
        sync=types.SimpleNamespace(
            config=SyncConfig(replicas_to_aggregate, workers, step_timeout=60.0)
        )
    )
    if not refused:
        SyncTraining.check_steps(training, steps)
        return
    with pytest.raises(ValueError) as error:
        SyncTraining.check_steps(training, steps)
    message = str(error.value)
    assert f"replicas_to_aggregate={replicas_to_aggregate}" in message
    assert f"runs {steps} steps on each of {workers} workers" in message
    assert "lower" in message  # how to fix it


@pytest.mark.parametrize(
    ("get", "identifier", "expected"),
    [
        (
            kpd.aggregators.get,
            kpd.aggregators.GeometricMedian,
            "instantiate it, e.g. aggregator=GeometricMedian(), or pass its id, "
            "aggregator='geometric_median'",
        ),
        (
            kpd.aggregators.get,
            "TrimmedMean",
            "'TrimmedMean' is the class of 'trimmed_mean': pass that id",
        ),
        (
            kpd.attacks.get,
            kpd.attacks.ALIE,
            "instantiate it with the replicas it controls, e.g. "
            "attack=ALIE(replicas=[7])",
        ),
    ],
    ids=["aggregator-class", "aggregator-class-name", "attack-class"],
)
def test_a_class_where_an_instance_or_id_goes_names_the_fix(get, identifier, expected):
    with pytest.raises(ValueError) as e:
        get(identifier)
    assert expected in str(e.value)


# -------------------------------------------- config dicts and constructor args

_MEDIAN_BOGUS = {"class_name": "median", "config": {"bogus": 1}}
_MEDIAN_NAMED = [
    "Could not build Median from its config: unknown argument 'bogus'",
    "Median accepts: num_byzantine, jit_compile.",
    "Received: config={'bogus': 1}",
]
_ALIE_BOGUS = {"class_name": "alie", "config": {"replicas": [1], "bogus": 1}}
_ALIE_NAMED = [
    "Could not build ALIE from its config: unknown argument 'bogus'",
    "ALIE accepts: replicas, z.",
]
_FROM_TF_CONFIG = "cluster_resolver=keras_psdist.cluster.from_tf_config(...)"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: kpd.aggregators.get(_MEDIAN_BOGUS), _MEDIAN_NAMED),
        (lambda: kpd.PSStrategy(aggregator=_MEDIAN_BOGUS), _MEDIAN_NAMED),
        (lambda: kpd.SyncReplicaStrategy(aggregator=_MEDIAN_BOGUS), _MEDIAN_NAMED),
        (
            lambda: kpd.aggregators.get(
                {"class_name": "bucketing", "config": {"aggregator": _MEDIAN_BOGUS}}
            ),
            _MEDIAN_NAMED,
        ),
        (
            lambda: kpd.aggregators.get(
                {"class_name": "trimmed_mean", "config": {"num_byzantin": 1}}
            ),
            ["unknown argument 'num_byzantin' (did you mean 'num_byzantine'?)"],
        ),
        (
            lambda: kpd.aggregators.get({"class_name": "median", "config": [1]}),
            ["must be a dict of constructor arguments", "Received: config=[1]"],
        ),
        (
            lambda: kpd.aggregators.get({"class_name": "median", "num_byzantine": 1}),
            ["Received unknown keys ['num_byzantine']", "inside 'config'"],
        ),
        (
            lambda: kpd.aggregators.get({"class_name": ["median"]}),
            ["Unknown aggregator ['median']. Expected one of: mean, median"],
        ),
        (lambda: kpd.attacks.get(_ALIE_BOGUS), _ALIE_NAMED),
        (lambda: kpd.PSStrategy(attack=_ALIE_BOGUS), _ALIE_NAMED),
        (
            lambda: kpd.attacks.get({"class_name": "alie", "config": {}}),
            ["Could not build ALIE from its config: it needs 'replicas'", "Add it"],
        ),
        (
            lambda: kpd.aggregators.TrimmedMean(jit_compile="no"),
            ["TrimmedMean's `jit_compile` must be True or False.", "'no' (a str)"],
        ),
        (
            lambda: kpd.PSStrategy(devices=[1]),
            ["Received: devices=[1], whose item 1 is an int", "devices=['/gpu:1']"],
        ),
        (
            lambda: kpd.PSStrategy(devices=[0]),
            ["Received: devices=[0], whose item 0 is an int", "devices=['/gpu:0']"],
        ),
        (
            lambda: kpd.PSStrategy(devices=[""]),
            ["Received: devices=['']", "is an empty string"],
        ),
        (
            lambda: kpd.PSStrategy(devices=3),
            ["Received: devices=3 (an int). Pass a list"],
        ),
        (
            lambda: kpd.PSStrategy(parameter_devices=[None]),
            ["Received: parameter_devices=[None], whose item None is None"],
        ),
        (
            lambda: kpd.PSStrategy(devices=["/cpu:0"], parameter_devices=[0]),
            ["Received: parameter_devices=[0], whose item 0 is an int"],
        ),
        (
            lambda: kpd.SyncReplicaStrategy(parameter_devices=[0]),
            ["Received: parameter_devices=[0], whose item 0 is an int"],
        ),
        (
            lambda: kpd.PSStrategy(cluster_resolver="x"),
            [
                "`cluster_resolver` must be a tf.distribute.cluster_resolver."
                "ClusterResolver or a keras_psdist.cluster.ClusterConfig. "
                "Received: cluster_resolver='x' (a str).",
                _FROM_TF_CONFIG,
            ],
        ),
        (
            lambda: kpd.SyncReplicaStrategy(cluster_resolver={"cluster": {}}),
            ["Received: cluster_resolver={'cluster': {}} (a dict)", _FROM_TF_CONFIG],
        ),
        (
            lambda: kpd.PSStrategy(cluster_resolver=3),
            ["Received: cluster_resolver=3 (an int)."],
        ),
        (
            lambda: cluster.from_resolver("x"),
            ["`resolver` must be a tf.distribute.cluster_resolver.ClusterResolver."],
        ),
    ],
    ids=[
        "aggregator-unknown-key",
        "ps-aggregator-unknown-key",
        "sync-aggregator-unknown-key",
        "inner-aggregator-unknown-key",
        "aggregator-near-miss-key",
        "aggregator-config-not-a-dict",
        "aggregator-argument-outside-config",
        "aggregator-unhashable-id",
        "attack-unknown-key",
        "ps-attack-unknown-key",
        "attack-missing-argument",
        "jit-compile-str",
        "devices-int",
        "devices-zero",
        "devices-empty-name",
        "devices-not-a-list",
        "parameter-devices-none",
        "parameter-devices-int",
        "sync-parameter-devices-int",
        "cluster-resolver-str",
        "sync-cluster-resolver-dict",
        "cluster-resolver-int",
        "from-resolver-str",
    ],
)
def test_bad_arguments_name_what_was_received_and_the_fix(make, expected):
    with pytest.raises(ValueError) as error:
        make()
    message = str(error.value)
    for part in expected:
        assert part in message, message


_JIT_COMPILE_RULES = [
    name
    for name in kpd.aggregators.names()
    if "jit_compile"
    in inspect.signature(kpd.aggregators.get(name).__class__).parameters
]


def test_every_rule_with_jit_compile_is_checked():
    assert len(_JIT_COMPILE_RULES) >= 8, _JIT_COMPILE_RULES


@pytest.mark.parametrize("name", _JIT_COMPILE_RULES)
@pytest.mark.parametrize("value", ["no", 1, 0.0, None, [True]])
def test_jit_compile_is_a_bool_not_a_truthy_value(name, value):
    cls = type(kpd.aggregators.get(name))
    with pytest.raises(ValueError, match=f"{cls.__name__}'s `jit_compile` must be"):
        kpd.aggregators.get({"class_name": name, "config": {"jit_compile": value}})
    assert cls(jit_compile=np.False_).jit_compile is False


# Any config dict, near-miss or not: a rule / an attack, or a ValueError.
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 9),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.lists(st.integers(-1, 9), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _config_dicts(registry):
    """Mostly a registered id with a dict of its own arguments (some
    misspelt), each of any value; else a malformed dict."""

    def of(name):
        own = st.sampled_from(list(inspect.signature(registry.lookup(name)).parameters))
        arguments = st.dictionaries(
            st.one_of(own, own, own, st.text(max_size=6)), _VALUES, max_size=4
        )
        return st.fixed_dictionaries({"class_name": st.just(name), "config": arguments})

    well_formed = st.sampled_from(sorted(registry.names())).flatmap(of)
    malformed = st.one_of(
        st.fixed_dictionaries(
            {
                "class_name": st.one_of(
                    st.sampled_from(sorted(registry.names())), _VALUES
                )
            },
            optional={"config": _VALUES},
        ),
        st.dictionaries(st.sampled_from(["class_name", "config", "x"]), _VALUES),
    )
    return st.one_of(well_formed, well_formed, well_formed, malformed)


@settings(max_examples=300, deadline=None)
@given(_config_dicts(AGGREGATORS))
def test_any_aggregator_config_builds_or_raises_value_error(config):
    try:
        rule = kpd.aggregators.get(config)
    except ValueError as e:
        assert str(e)
        return
    assert isinstance(rule, kpd.aggregators.Aggregator)


@settings(max_examples=300, deadline=None)
@given(_config_dicts(ATTACKS))
def test_any_attack_config_builds_or_raises_value_error(config):
    try:
        attack = kpd.attacks.get(config)
    except ValueError as e:
        assert str(e)
        return
    assert isinstance(attack, kpd.attacks.Attack)


@settings(max_examples=200, deadline=None)
@given(st.one_of(_VALUES, st.lists(_VALUES, max_size=3)))
def test_any_device_list_is_canonical_or_a_value_error(devices):
    try:
        names = canonical_names(devices, "devices")
    except ValueError as e:
        assert "devices" in str(e)
        return
    assert names is None or all(n.startswith("/job:") for n in names)
