"""Contract tests for every simulated attack, plus lookup and serialization."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks
from tests import reference as ref_rules
from tests import reference_attacks as ref

N = 8
SHAPES = [(3, 2), (5,)]

# One configuration per registered attack, with non-default arguments.
CASES = {
    "sign_flip": {"scale": 2.5},
    "scale": {"factor": -3.0},
    "gaussian_noise": {"stddev": 2.0, "seed": 3},
    "non_finite": {"value": "-inf"},
    "alie": {},
    "ipm": {"epsilon": 0.5},
    "optimal_alie": {"min_z": 0.2, "max_z": 5.0, "num_candidates": 8},
    "optimal_ipm": {"min_epsilon": 0.05, "max_epsilon": 50.0, "num_candidates": 8},
    "mimic": {},
    "min_max": {"perturbation": "std"},
    "min_sum": {"perturbation": "sign"},
    "optimal_label_flip": {"num_classes": 10, "max_scale": 20.0},
    "rop": {"z": 2.0, "reference_weight": 0.5, "location": 0.25, "angle": 60.0},
    "label_flip": {"num_classes": 10},
}
EXTRA_CASES = [
    ("alie", {"z": 1.5}),
    ("non_finite", {"value": "nan"}),
    ("sign_flip", {}),
    ("optimal_alie", {}),
    ("optimal_ipm", {}),
    ("mimic", {"target": 4}),
    ("min_max", {}),
    ("min_max", {"perturbation": "sign"}),
    ("min_sum", {}),
    ("min_sum", {"perturbation": "std"}),
    ("rop", {}),
]
ALL_CASES = list(CASES.items()) + EXTRA_CASES
# Matched value for value against their reference (noise only statistically).
DETERMINISTIC = [(k, kw) for k, kw in ALL_CASES if k != "gaussian_noise"]
REPLICA_SETS = [[6, 7], [0, 3, 5], [2]]


def _case_id(case):
    name, kwargs = case
    return name + "".join(f"-{k}={v}" for k, v in kwargs.items())


def _inputs(seed=0, shapes=SHAPES, n=N, loc=0.0):
    """Per-variable stacked float32 arrays and the matching list of lists."""
    rng = np.random.default_rng(seed)
    stacked = [rng.normal(loc=loc, size=(n, *s)).astype(np.float32) for s in shapes]
    per_replica = [[tf.constant(row) for row in values] for values in stacked]
    return stacked, per_replica


# The rule adaptive attacks are tried against in the generic tests.
def _tf_rule(n, name="median"):
    return aggregators.get(name).bind(n, min(2, (n - 1) // 2))


def _apply(attack, per_replica):
    """`attack.apply`, handing adaptive attacks the median."""
    if isinstance(attack, attacks.AdaptiveAttack):
        return attack.apply(per_replica, rule=_tf_rule(len(per_replica[0])).aggregate)
    return attack.apply(per_replica)


def _expected(name, kwargs, stacked, replicas):
    """The reference's arrays, one per variable (adaptive: against the median)."""
    if name in ref.ADAPTIVE:
        rule = ref_rules.reference_for(_tf_rule(len(stacked[0])))
        return ref.REFERENCES[name](stacked, replicas, rule, **kwargs)
    if name in ref.WHOLE_MODEL:
        return ref.REFERENCES[name](stacked, replicas, **kwargs)
    return [ref.REFERENCES[name](values, replicas, **kwargs) for values in stacked]


def test_every_attack_has_a_case_and_a_reference():
    assert set(attacks.names()) == set(CASES) == set(ref.REFERENCES)


@pytest.mark.parametrize("replicas", REPLICA_SETS, ids=str)
@pytest.mark.parametrize("case", DETERMINISTIC, ids=_case_id)
def test_matches_numpy_reference(case, replicas):
    name, kwargs = case
    stacked, per_replica = _inputs()
    attack = attacks.get(
        {"class_name": name, "config": {"replicas": replicas, **kwargs}}
    )
    out = _apply(attack, per_replica)
    expected = _expected(name, kwargs, stacked, replicas)
    for want, column in zip(expected, out, strict=True):
        got = np.stack([v.numpy() for v in column])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_honest_replicas_pass_through_and_inputs_are_not_edited(case):
    name, kwargs = case
    replicas = [1, 6]
    stacked, per_replica = _inputs()
    outer, columns = list(per_replica), [list(c) for c in per_replica]
    attack = attacks.get(
        {"class_name": name, "config": {"replicas": replicas, **kwargs}}
    )
    out = _apply(attack, per_replica)
    assert out is not per_replica
    assert per_replica == outer
    for v, column in enumerate(per_replica):
        assert out[v] is not column
        assert len(out[v]) == N
        assert all(a is b for a, b in zip(column, columns[v], strict=True))
        np.testing.assert_array_equal(np.stack([t.numpy() for t in column]), stacked[v])
        for r in range(N):
            if r not in replicas:
                assert out[v][r] is column[r]
            assert out[v][r].shape == column[r].shape
            assert out[v][r].dtype == column[r].dtype


@pytest.mark.parametrize("case", DETERMINISTIC, ids=_case_id)
def test_runs_in_a_graph_with_an_unknown_first_dimension(case):
    # Sparse variables reach the attack as dense blocks over the touched rows.
    name, kwargs = case
    replicas = [0, 5]
    stacked, per_replica = _inputs(shapes=[(4, 3)])
    attack = attacks.get(
        {"class_name": name, "config": {"replicas": replicas, **kwargs}}
    )
    spec = [tf.TensorSpec([None, 3], tf.float32)] * N

    @tf.function(input_signature=spec)
    def run(*column):
        return _apply(attack, [list(column)])[0]

    got = np.stack([v.numpy() for v in run(*per_replica[0])])
    [expected] = _expected(name, kwargs, stacked, replicas)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_noise_statistics():
    stddev, replicas = 2.0, [1, 4]
    shapes = [(100, 50), (100, 50)]
    stacked, per_replica = _inputs(shapes=shapes)
    out = attacks.GaussianNoise(replicas, stddev=stddev, seed=7).apply(per_replica)
    expected = [ref.gaussian_noise(s, replicas, stddev=stddev, seed=7) for s in stacked]
    samples = []
    for v, column in enumerate(out):
        got = np.stack([t.numpy() for t in column])
        honest = [r for r in range(N) if r not in replicas]
        np.testing.assert_array_equal(got[honest], stacked[v][honest])
        noise = got[replicas]
        assert noise.shape == (len(replicas), *shapes[v])
        assert np.all(np.isfinite(noise))
        # 5,000 samples per replica: the std's standard error is about 1%.
        for sample, reference in zip(noise, expected[v][replicas], strict=True):
            assert abs(sample.mean()) < 0.1
            assert sample.std() == pytest.approx(stddev, rel=0.05)
            assert sample.std() == pytest.approx(reference.std(), rel=0.08)
        samples.extend(noise)
    # Independent across replicas and variables of the same shape.
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            assert abs(np.corrcoef(samples[i].ravel(), samples[j].ravel())[0, 1]) < 0.05


@pytest.mark.parametrize(
    "n, f, expected",
    [
        # s = floor(8/2 + 1) - 2 = 3, z = Phi^-1((8 - 3)/8) = Phi^-1(0.625).
        (8, 2, 0.31863936396437514),
        # s = floor(50/2 + 1) - 12 = 14, z = Phi^-1((50 - 14)/50) = Phi^-1(0.72).
        (50, 12, 0.5828415072712162),
        # s = floor(5/2 + 1) - 3 = 0 -> clamped to 1, z = Phi^-1(4/5) = Phi^-1(0.8).
        (5, 3, 0.8416212335729143),
        # s = floor(2/2 + 1) - 1 = 1, z = Phi^-1(1/2) = 0.
        (2, 1, 0.0),
    ],
)
def test_alie_z_formula(n, f, expected):
    assert attacks.ALIE.paper_z(n, f) == pytest.approx(expected, abs=1e-12)
    assert ref.alie_z(n, f) == pytest.approx(expected, abs=1e-12)


def test_alie_sends_mu_minus_z_sigma_from_the_honest_replicas():
    column = [tf.constant([0.0]), tf.constant([2.0]), tf.constant([100.0])]
    out = attacks.ALIE([2], z=1.0).apply([column])[0]
    # Honest: {0, 2}, mu = 1, population sigma = 1; the attacker's own 100 is ignored.
    assert out[2].numpy().tolist() == [0.0]


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.uint8])
@pytest.mark.parametrize("shape", [(6,), (2, 3), (3, 1)])
def test_label_flip_integer_labels(dtype, shape):
    y = (
        np.random.default_rng(0)
        .integers(0, 10, size=shape)
        .astype(dtype.as_numpy_dtype)
    )
    x, sample_weight = tf.ones([shape[0], 2]), tf.ones([shape[0]])
    attack = attacks.LabelFlip([3], num_classes=10)
    out = attack.corrupt_batch((x, tf.constant(y), sample_weight))
    assert isinstance(out, tuple) and len(out) == 3
    assert out[0] is x and out[2] is sample_weight
    assert out[1].dtype == dtype
    np.testing.assert_array_equal(out[1].numpy(), ref.flip_labels(y, 10))


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 10)])
def test_label_flip_one_hot_and_probability_labels(shape):
    rng = np.random.default_rng(1)
    probabilities = rng.dirichlet(np.ones(10), size=shape[:-1]).astype(np.float32)
    one_hot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size=shape[:-1])]
    attack = attacks.LabelFlip([0], num_classes=10)
    for y in (one_hot, probabilities):
        x, flipped = attack.corrupt_batch([tf.zeros([shape[0], 1]), tf.constant(y)])
        np.testing.assert_allclose(flipped.numpy(), ref.flip_labels(y, 10))
    np.testing.assert_array_equal(
        np.argmax(attack.flip_labels(one_hot).numpy(), -1), 9 - np.argmax(one_hot, -1)
    )


def test_label_flip_in_a_graph_and_without_labels():
    attack = attacks.LabelFlip([0], num_classes=3)
    flip = tf.function(lambda x, y: attack.corrupt_batch((x, y)))
    _, y = flip(tf.zeros([3, 1]), tf.constant([0, 1, 2], tf.int64))
    assert y.numpy().tolist() == [2, 1, 0]
    x = tf.zeros([2, 1])
    assert attack.corrupt_batch(x) is x
    batch = (x,)
    assert attack.corrupt_batch(batch) is batch
    assert attack.corrupt_batch((x, None, None))[1] is None
    column = [tf.constant([1.0]), tf.constant([2.0])]
    [out] = attack.apply([column])
    assert out is not column and all(a is b for a, b in zip(out, column, strict=True))


@pytest.mark.parametrize(
    "labels, match",
    [
        (tf.zeros([4, 1]), r"shape \(4, 1\).*num_classes=10"),
        (tf.zeros([4, 9]), "num_classes=10"),
        (tf.constant(1.0), "shape \\(\\)"),
        (tf.constant([True, False]), "dtype bool"),
        ({"out": tf.constant([1])}, "nested"),
        (tf.ragged.constant([[1], [2, 3]]), "ragged"),
    ],
    ids=["float-last-1", "float-last-9", "scalar", "bool", "dict", "ragged"],
)
def test_label_flip_rejects_other_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        attacks.LabelFlip([0], num_classes=10).corrupt_batch((tf.zeros([2, 1]), labels))


@pytest.mark.parametrize(
    "replicas",
    [[], [-1], [1, 1], "01", 3, [1.0], [True], None],
    ids=["empty", "negative", "duplicate", "str", "int", "float", "bool", "none"],
)
def test_bad_replicas(replicas):
    with pytest.raises(ValueError, match="Received: replicas="):
        attacks.SignFlip(replicas)


def test_check_names_the_valid_range_and_the_fix():
    attack = attacks.ALIE([6, 8])
    with pytest.raises(
        ValueError, match=r"valid ids: 0 to 7.*Pick replica ids below 8"
    ):
        attack.check(8)
    attack.check(9)
    with pytest.raises(ValueError, match="num_replicas=0"):
        attack.check(0)


@pytest.mark.parametrize("name", list(CASES))
def test_attacking_every_replica_is_refused(name):
    attack = attacks.get(
        {"class_name": name, "config": {"replicas": [0, 1], **CASES[name]}}
    )
    with pytest.raises(ValueError, match="at least one must stay honest"):
        attack.check(2)
    _, per_replica = _inputs(n=2)
    if isinstance(attack, attacks.GradientAttack):
        with pytest.raises(ValueError, match="at least one must stay honest"):
            _apply(attack, per_replica)


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (attacks.SignFlip, {"scale": 0.0}, "scale"),
        (attacks.Scale, {"factor": float("inf")}, "factor"),
        (attacks.Scale, {"factor": "2"}, "factor"),
        (attacks.GaussianNoise, {"stddev": -1.0}, "stddev"),
        (attacks.GaussianNoise, {"seed": 1.5}, "seed"),
        (attacks.NonFinite, {"value": "zero"}, "'nan', 'inf', '-inf'"),
        (attacks.NonFinite, {"value": []}, r"value=\[\]"),
        (attacks.ALIE, {"z": float("nan")}, "z"),
        (attacks.IPM, {"epsilon": -0.1}, "epsilon"),
        (attacks.LabelFlip, {"num_classes": 1}, "num_classes"),
        (attacks.LabelFlip, {"num_classes": 2.5}, "num_classes"),
        (attacks.LabelFlip, {"num_classes": True}, "num_classes"),
        (attacks.OptimalALIE, {"min_z": 0.0}, "min_z"),
        (attacks.OptimalALIE, {"max_z": float("inf")}, "max_z"),
        (attacks.OptimalALIE, {"min_z": 2.0, "max_z": 1.0}, r"min_z=2.0, max_z=1.0"),
        (attacks.OptimalALIE, {"num_candidates": 1}, "num_candidates"),
        (attacks.OptimalALIE, {"num_candidates": 4.0}, "num_candidates"),
        (attacks.OptimalIPM, {"min_epsilon": -1.0}, "min_epsilon"),
        (attacks.OptimalIPM, {"max_epsilon": 0.001}, "max_epsilon"),
        (attacks.OptimalIPM, {"num_candidates": True}, "num_candidates"),
        (attacks.Mimic, {"target": -1}, "target"),
        (attacks.Mimic, {"target": "1"}, "target"),
        (attacks.Mimic, {"target": True}, "target"),
        (attacks.Mimic, {"target": 0}, r"target=0, replicas=\[0\]"),
        (attacks.MinMax, {"perturbation": "unit"}, "perturbation='unit'"),
        (attacks.MinSum, {"perturbation": None}, "perturbation=None"),
        (attacks.OptimalLabelFlip, {"num_classes": 1}, "num_classes=1"),
        (
            attacks.OptimalLabelFlip,
            {"num_classes": 10, "min_scale": 5.0, "max_scale": 2.0},
            "min_scale=5.0, max_scale=2.0",
        ),
        (attacks.ROP, {"z": 0.0}, "z=0.0"),
        (attacks.ROP, {"reference_weight": 1.5}, "reference_weight=1.5"),
        (attacks.ROP, {"location": -0.1}, "location=-0.1"),
        (attacks.ROP, {"angle": float("nan")}, "angle=nan"),
    ],
)
def test_bad_arguments(cls, kwargs, match):
    with pytest.raises(ValueError, match=f"Received: {match}|{match}.*Received"):
        cls([0], **kwargs)


def test_forge_must_return_one_value_per_attacked_replica():
    class Broken(attacks.GradientAttack):
        def forge(self, honest, own):
            return [values[:1] for values in own]

    _, per_replica = _inputs()
    with pytest.raises(ValueError, match="one value per attacked replica"):
        Broken([1, 2]).apply(per_replica)


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_config_round_trip(case):
    name, kwargs = case
    attack = attacks.get({"class_name": name, "config": {"replicas": [6, 7], **kwargs}})
    config = attacks.serialize(attack)
    assert config["class_name"] == name
    again = attacks.get(config)
    assert type(again) is type(attack)
    assert again.get_config() == attack.get_config()
    assert again.replicas == (6, 7)
    assert repr(again) == repr(attack)
    assert repr(again).startswith(f"{type(attack).__name__}(replicas=[6, 7]")
    assert (
        type(attack).from_config(attack.get_config()).get_config() == config["config"]
    )


def test_get():
    attack = attacks.IPM([7])
    assert attacks.get(attack) is attack
    assert attacks.get(None) is None
    with pytest.raises(
        ValueError, match="Unknown attack 'alei'. Expected one of: sign_flip, "
    ):
        attacks.get({"class_name": "alei", "config": {"replicas": [7]}})
    with pytest.raises(ValueError, match="needs the replicas"):
        attacks.get("alie")
    with pytest.raises(ValueError, match="Unknown attack 'alei'"):
        attacks.get("alei")
    with pytest.raises(ValueError, match="Could not interpret"):
        attacks.get(3)
    with pytest.raises(ValueError, match="Could not build ALIE"):
        attacks.get({"class_name": "alie", "config": {"replicas": [7], "zz": 1.0}})
    with pytest.raises(ValueError, match="unknown keys"):
        attacks.get({"class_name": "alie", "config": {"replicas": [7]}, "extra": 1})
    with pytest.raises(ValueError, match="not one of the registered"):
        attacks.serialize(attacks.Attack([0]))


# -------------------------------------------------------------- mimic


def test_mimic_copies_the_first_honest_replica_or_its_target():
    stacked, per_replica = _inputs()
    [out] = attacks.Mimic([0, 1, 5]).apply(per_replica[:1])
    assert all(out[r] is per_replica[0][2] for r in (0, 1, 5))
    [out] = attacks.Mimic([0, 1, 5], target=6).apply(per_replica[:1])
    assert all(out[r] is per_replica[0][6] for r in (0, 1, 5))
    np.testing.assert_array_equal(out[5].numpy(), stacked[0][6])


def test_mimic_target_outside_the_replicas_is_refused_at_check():
    attack = attacks.Mimic([0], target=8)
    attack.check(9)
    with pytest.raises(
        ValueError,
        match=r"copies replica 8.*valid ids: 0 to 7.*target=8, num_replicas=8.*"
        r"Pick a target below 8",
    ):
        attack.check(8)
    with pytest.raises(ValueError, match="copies replica 8"):
        attack.apply(_inputs()[1])


# ------------------------------------------------------ adaptive attacks

# Rules of every kind the search is run against: coordinate-wise, by
# distance, iterative, stateful (centered clipping) and a wrapper (NNM).
SEARCH_RULES = [
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "geometric_median",
    "centered_clipping",
    "nnm",
]
ADAPTIVE_CASES = [
    ("optimal_alie", {}),
    ("optimal_ipm", {}),
    ("optimal_alie", {"min_z": 0.5, "max_z": 3.0, "num_candidates": 5}),
    ("optimal_label_flip", {"num_classes": 10}),
]


@pytest.mark.parametrize("rule_name", SEARCH_RULES)
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=_case_id)
def test_adaptive_search_matches_numpy_reference(case, rule_name):
    name, kwargs = case
    replicas = [6, 7]
    stacked, per_replica = _inputs(seed=1, loc=0.3)
    rule = aggregators.get(rule_name).bind(N, 2)
    np_rule = ref_rules.reference_for(rule)
    attack = attacks.get(
        {"class_name": name, "config": {"replicas": replicas, **kwargs}}
    )
    factors, damages = attack.search(per_replica, rule=rule.aggregate)
    want_factors = ref.FACTORS[name](N, len(replicas), **kwargs)
    np.testing.assert_allclose(factors.numpy(), want_factors, rtol=1e-12)
    _, want_damages = ref.factor_search(
        stacked, replicas, np_rule, want_factors, ref.FORGE[name]
    )
    np.testing.assert_allclose(damages.numpy(), want_damages, rtol=1e-4, atol=1e-6)
    # The search is not flat here: the factor it picks matters.
    assert want_damages.max() > 1.05 * want_damages.min()
    out = attack.apply(per_replica, rule=rule.aggregate)
    expected = ref.REFERENCES[name](stacked, replicas, np_rule, **kwargs)
    for want, column in zip(expected, out, strict=True):
        got = np.stack([v.numpy() for v in column])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _damage(rule, per_replica, stacked, replicas):
    """Squared distance (float64) of the rule's output from the honest mean."""
    honest = [r for r in range(N) if r not in replicas]
    out = rule.aggregate(per_replica)
    return sum(
        float(np.sum((v.numpy().astype(np.float64) - x[honest].mean(axis=0)) ** 2))
        for v, x in zip(out, stacked, strict=True)
    )


@pytest.mark.parametrize("rule_name", ["median", "trimmed_mean"])
@pytest.mark.parametrize(
    "fixed, optimal",
    [
        (attacks.ALIE([6, 7]), attacks.OptimalALIE([6, 7])),
        (attacks.IPM([6, 7]), attacks.OptimalIPM([6, 7])),
    ],
    ids=["alie", "ipm"],
)
def test_optimal_attack_does_at_least_the_fixed_attacks_damage(
    fixed, optimal, rule_name
):
    rule = aggregators.get(rule_name).bind(N, 2)
    default = fixed.z if isinstance(fixed, attacks.ALIE) else fixed.epsilon
    if default is None:
        default = attacks.ALIE.paper_z(N, 2)
    gains = []
    for seed in range(3):
        stacked, per_replica = _inputs(seed=seed, loc=0.3)
        by_fixed = _damage(rule, fixed.apply(per_replica), stacked, [6, 7])
        by_optimal = _damage(
            rule, optimal.apply(per_replica, rule=rule.aggregate), stacked, [6, 7]
        )
        assert by_fixed > 0
        assert by_optimal >= by_fixed * (1 - 1e-6)
        # The fixed attack's factor is a candidate, its damage measured alike.
        factors, damages = optimal.search(per_replica, rule=rule.aggregate)
        [at_default] = np.flatnonzero(np.isclose(factors.numpy(), default, rtol=1e-12))
        assert damages.numpy()[at_default] == pytest.approx(by_fixed, rel=1e-5)
        assert damages.numpy().max() == pytest.approx(by_optimal, rel=1e-5)
        gains.append(by_optimal / by_fixed)
    # Not vacuous: the search finds much more than the default factor does.
    assert max(gains) > 1.5, gains


def test_an_adaptive_attack_needs_the_rule():
    _, per_replica = _inputs()
    attack = attacks.OptimalIPM([7])
    with pytest.raises(
        ValueError, match=r"OptimalIPM\(replicas=\[7\].*needs it.*Received: rule=None"
    ):
        attack.apply(per_replica)
    with pytest.raises(ValueError, match="Received: rule=3"):
        attack.search(per_replica, rule=3)


def test_search_takes_the_largest_damage_the_first_on_ties_never_nan():
    # Against the mean the damage grows with z: the largest candidate wins.
    stacked, per_replica = _inputs()
    mean = aggregators.Mean()
    attack = attacks.OptimalALIE([6, 7], min_z=1.0, max_z=4.0, num_candidates=3)
    factors, damages = attack.search(per_replica, rule=mean.aggregate)
    assert factors.numpy().tolist() == [0.0, ref.alie_z(N, 2), 1.0, 2.0, 4.0]
    assert np.all(np.diff(damages.numpy()) > 0)
    [out, _] = attack.apply(per_replica, rule=mean.aggregate)
    want = ref.alie(stacked[0], [6, 7], z=4.0)[7]
    np.testing.assert_allclose(out[7].numpy(), want, rtol=1e-5, atol=1e-6)
    honest = stacked[0][:6].mean(axis=0)

    # A rule that ignores the attackers: every damage equal, the first (0) wins.
    def honest_only(values):
        return [tf.reduce_mean(tf.stack(column[:6]), 0) for column in values]

    [out, _] = attack.apply(per_replica, rule=honest_only)
    np.testing.assert_allclose(out[7].numpy(), honest, rtol=1e-5, atol=1e-6)

    # A rule that fails (NaN) when the attackers are far: those never win.
    def nan_when_far(values):
        return [
            tf.where(tf.reduce_max(tf.abs(column[7])) > 1e3, np.nan, column[7])
            for column in values
        ]

    attack = attacks.OptimalIPM(
        [6, 7], min_epsilon=1.0, max_epsilon=1e6, num_candidates=2
    )
    factors, damages = attack.search(per_replica, rule=nan_when_far)
    assert factors.numpy().tolist() == [0.0, 0.1, 1.0, 1e6]
    assert np.isnan(damages.numpy()[-1])
    [out, _] = attack.apply(per_replica, rule=nan_when_far)
    np.testing.assert_allclose(out[7].numpy(), -honest, rtol=1e-5, atol=1e-6)


def test_under_attack_hands_the_rule_its_state_of_the_step():
    # A stateful rule (centered clipping's center) must be tried as it runs
    # this step: every candidate is aggregated with the step's state.
    seen = []

    class Recording(aggregators.Aggregator):
        def apply(self, per_replica, state=()):
            seen.append(state)
            values = [tf.reduce_mean(tf.stack(column), 0) for column in per_replica]
            return aggregators.Aggregation(values, {}, state)

    _, per_replica = _inputs()
    state = {"center": tf.constant(3.0)}
    attack = attacks.OptimalIPM([6, 7], num_candidates=4)
    result = attacks.UnderAttack(Recording(), attack).apply(per_replica, state)
    assert result.state is state
    assert len(seen) == len(attack.candidates(N, 2)) + 1
    assert all(s is state for s in seen)


@pytest.mark.parametrize(
    "attack",
    [
        attacks.OptimalIPM([3], num_candidates=4),
        attacks.OptimalALIE([3], num_candidates=4),
        attacks.Mimic([3]),
        attacks.ROP([3]),
        attacks.MinMax([3]),
        attacks.OptimalLabelFlip([3], num_classes=10, num_candidates=4),
    ],
    ids=repr,
)
def test_runs_inside_a_strategy(cpu_devices, digits, attack):
    x, y = digits[0][:256], digits[1][:256]
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="centered_clipping",
        num_byzantine=1,
        attack=attack,
    )
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(16), keras.layers.Dense(10)]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert np.isfinite(history.history["loss"]).all()


def test_sync_replicas_refuse_attacks_that_read_honest_gradients():
    from keras_psdist.modes.sync_replicas import resolve_worker_attack

    for attack in (
        attacks.Mimic([1]),
        attacks.OptimalIPM([1]),
        attacks.ALIE([1]),
        attacks.MinMax([1]),
        attacks.MinSum([1]),
        attacks.ROP([1]),
    ):
        with pytest.raises(ValueError, match="cannot see.*Use sign_flip, scale,"):
            resolve_worker_attack(attack, 4, 1)
    # Those a faulty worker runs on its own gradient or data pass.
    for name in ("sign_flip", "non_finite", "label_flip"):
        config = {"class_name": name, "config": {"replicas": [1]}}
        if name == "label_flip":
            config["config"]["num_classes"] = 10
        assert resolve_worker_attack(config, 4, 1) is not None


@pytest.mark.parametrize("where", ["gradient_path", "under_attack"])
def test_rop_remembers_each_aggregate(where):
    """Three steps: each forgery is the reference's, from the aggregate of
    the step before (the rule's output on what the attack left)."""
    from keras_psdist.gradients import Replicas, gradient_path

    attack = attacks.ROP([6, 7], z=1.5)
    rule = aggregators.get("median").bind(N, 2)
    specs = [tf.TensorSpec(shape, tf.float32) for shape in SHAPES]
    if where == "gradient_path":
        path = gradient_path(rule, num_replicas=N, attack=attack)
        state = path.init(specs)
    else:
        wrapped = attacks.UnderAttack(rule, attack)
        state = wrapped.initial_state(specs)
    previous = None
    for step in range(3):
        stacked, per_replica = _inputs(seed=step, loc=1.0)
        expected = ref.rop(stacked, [6, 7], z=1.5, previous=previous)
        numpy_aggregate = ref_rules.median(expected, f=2)
        if where == "gradient_path":
            out, state = path.apply(Replicas(per_replica), state)
            seen = state[0]
        else:
            out = wrapped.apply(per_replica, state)
            state = out.state
            seen = state[1]
        for got, want in zip(out.values, numpy_aggregate, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        # What it keeps is that aggregate.
        for kept, want in zip(seen.previous, numpy_aggregate, strict=True):
            np.testing.assert_allclose(kept.numpy(), want, rtol=1e-5, atol=1e-5)
        assert float(seen.steps) == step + 1
        previous = numpy_aggregate


def test_rop_refuses_sparse_gradients_with_the_reason():
    with pytest.raises(ValueError, match="shape that changes between steps"):
        attacks.ROP([1]).initial_state([tf.TensorSpec([None, 4], tf.float32)])
