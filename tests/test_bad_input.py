"""Bad input over the public surface: a clear `ValueError`, never anything else.

Fuzz-style (hypothesis) for TF_CONFIG, whose every field a user or an
orchestrator writes by hand (the messages for each kind of mistake are
checked in test_cluster_config.py); targeted tests for what two processes can
disagree on (the model each builds). The other bad arguments are tested
beside the code they belong to; docs/reliability.md lists them all.
"""

from __future__ import annotations

import json
import string
import types

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_psdist as kpd
from keras_psdist import cluster
from keras_psdist.cluster.shared_variables import SharedVariables
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
