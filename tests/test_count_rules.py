"""Counts stated as rules of the number of workers (`keras_psdist.count_rules`):
each rule's count against a plain reference, the spellings the strategies
take, the errors, and the strategies deriving `replicas_to_aggregate` and
`num_byzantine` from their cluster before they connect."""

import math

import pytest

import keras_psdist as kpd
from keras_psdist import cluster, count_rules, modes
from keras_psdist.cluster.config import LAUNCH_MODE_ENV


def _reference(rule, n, round_up):
    """What each rule means, written out."""
    if isinstance(rule, count_rules.All):
        return n
    if isinstance(rule, count_rules.AllButOne):
        return max(1, n - 1)
    exact = rule.fraction * n
    if round_up:
        return max(1, math.ceil(round(exact, 6)))
    return math.floor(round(exact, 6))


@pytest.mark.parametrize(
    "rule",
    [
        count_rules.All(),
        count_rules.AllButOne(),
        count_rules.Fraction(0.75),
        count_rules.Fraction(0.25),
        count_rules.Fraction(0.5),
        count_rules.Fraction(1.0),
        count_rules.Fraction(0.1),
    ],
    ids=repr,
)
@pytest.mark.parametrize("n", range(1, 33))
def test_each_rule_counts_as_its_reference(rule, n):
    assert count_rules.count(rule, n, "replicas_to_aggregate") == _reference(
        rule, n, round_up=True
    )
    below = count_rules.count(rule, n, "num_byzantine")
    if isinstance(rule, count_rules.Fraction):
        assert below == _reference(rule, n, round_up=False)
    assert 0 <= below <= n


def test_a_fraction_exact_in_decimal_is_not_rounded_past():
    # 0.75 * 4 is 3 in floating point too; 0.7 * 10 is 7.000000000000001.
    assert count_rules.count(0.7, 10, "replicas_to_aggregate") == 7
    assert count_rules.count(0.3, 10, "num_byzantine") == 3


@pytest.mark.parametrize(
    "value, expected",
    [
        ("all", count_rules.All()),
        ("all_but_one", count_rules.AllButOne()),
        (0.75, count_rules.Fraction(0.75)),
        (count_rules.Fraction(0.5), count_rules.Fraction(0.5)),
        (3, 3),
        (None, None),
    ],
)
def test_the_spellings(value, expected):
    assert count_rules.get(value, "replicas_to_aggregate") == expected


@pytest.mark.parametrize("value", ["most", 1.5, -1, float("nan"), True, 0.0, [3]])
def test_anything_else_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"replicas_to_aggregate") as error:
        count_rules.get(value, "replicas_to_aggregate")
    assert repr(value) in str(error.value)


@pytest.mark.parametrize("fraction", [0, 1.5, -0.5, "0.5", None])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match=r"fraction must be|`fraction` must be"):
        count_rules.Fraction(fraction)


# --------------------------------------------------------- the strategies

FOUR_WORKERS = {
    "ps": ["127.0.0.1:1"],
    "worker": [f"127.0.0.1:{port}" for port in (2, 3, 4, 5)],
}


def _sync_mode(monkeypatch, **kwargs):
    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    worker = cluster.ClusterConfig(FOUR_WORKERS, "worker", 1)
    arguments = modes.Arguments(cluster_resolver=worker, **kwargs).checked()
    mode = modes.SyncReplicasMode(arguments, "SyncReplicaStrategy")
    mode.validate()
    return mode.aggregation


@pytest.mark.parametrize(
    "replicas_to_aggregate, expected",
    [
        (kpd.count_rules.AllButOne(), 3),
        ("all_but_one", 3),
        (kpd.count_rules.All(), 4),
        (0.5, 2),
        (kpd.count_rules.Fraction(0.6), 3),  # 2.4, rounded up
        (None, 4),
        (2, 2),
    ],
)
def test_sync_replicas_derive_replicas_to_aggregate_from_the_workers(
    monkeypatch, replicas_to_aggregate, expected
):
    aggregation = _sync_mode(monkeypatch, replicas_to_aggregate=replicas_to_aggregate)
    assert aggregation.replicas_to_aggregate == expected
    assert aggregation.total_num_replicas == 4


def test_sync_replicas_derive_num_byzantine_and_bind_the_rule(monkeypatch):
    aggregation = _sync_mode(
        monkeypatch,
        aggregator="trimmed_mean",
        num_byzantine=kpd.count_rules.Fraction(0.25),  # 1 of 4 workers
    )
    assert aggregation.num_byzantine == 1
    assert aggregation.rule.num_byzantine == 1


def test_a_derived_count_the_rule_cannot_take_is_refused_before_connecting(
    monkeypatch,
):
    # Krum needs n > 2f + 2: 3 aggregated replicas cannot tolerate 1.
    with pytest.raises(ValueError, match="Krum"):
        _sync_mode(
            monkeypatch,
            aggregator="krum",
            replicas_to_aggregate="all_but_one",
            num_byzantine=0.25,
        )


def test_ps_strategy_derives_num_byzantine_from_its_replicas(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:8],
        aggregator="trimmed_mean",
        num_byzantine=kpd.count_rules.Fraction(0.25),
    )
    assert strategy.extended.aggregator.num_byzantine == 2
    assert "num_byzantine=2" in repr(strategy)


@pytest.mark.parametrize("value", ["half", 2.5, -1])
def test_the_strategies_refuse_a_bad_count_naming_it(value):
    with pytest.raises(ValueError, match="num_byzantine"):
        kpd.PSStrategy(num_byzantine=value)
