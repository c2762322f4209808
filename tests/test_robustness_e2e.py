"""End to end on digits: 8 replicas, 2 attackers, every rule against attacks.

The default run proves that the attacks bite (`mean` breaks under the scaled
sign flip; the slow run adds a large IPM and NaN) and that robust rules of each kind hold
against an attack that breaks the mean; the whole rule x attack matrix is `slow` (about
4 minutes on two cores with `-n 2`) and is also what `benchmarks/robustness.py` prints
into docs/robustness.md.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks

REPLICAS, ATTACKERS, F = 8, [6, 7], 2
EPOCHS, BATCH = 20, 128
TOLERANCE = 0.04  # accuracy points a robust rule may lose to the clean run

ATTACKS = {
    "none": lambda: None,
    "sign_flip": lambda: attacks.SignFlip(replicas=ATTACKERS, scale=10.0),
    "gaussian": lambda: attacks.GaussianNoise(replicas=ATTACKERS, stddev=10.0, seed=0),
    "alie": lambda: attacks.ALIE(replicas=ATTACKERS),
    "scale": lambda: attacks.Scale(replicas=ATTACKERS, factor=100.0),
    "ipm_small": lambda: attacks.IPM(replicas=ATTACKERS, epsilon=0.1),
    "ipm": lambda: attacks.IPM(replicas=ATTACKERS, epsilon=100.0),
    "nan": lambda: attacks.NonFinite(replicas=ATTACKERS),
    "label_flip": lambda: attacks.LabelFlip(replicas=ATTACKERS, num_classes=10),
    "optimal_alie": lambda: attacks.OptimalALIE(replicas=ATTACKERS),
    "min_max": lambda: attacks.MinMax(replicas=ATTACKERS),
    "min_sum": lambda: attacks.MinSum(replicas=ATTACKERS),
    "rop": lambda: attacks.ROP(replicas=ATTACKERS),
    "optimal_label_flip": lambda: attacks.OptimalLabelFlip(
        replicas=ATTACKERS, num_classes=10
    ),
}
# Issue 39's attacks, each run against every rule in the slow matrix.
NEW_ATTACKS = ("min_max", "min_sum", "rop", "optimal_label_flip")
# Bulyan (n >= 4f + 3) and bucketing (4 buckets for f = 2) cannot run here.
# The default run's tests share their runs (the clean mean's, above all)
# through `accuracy_of`'s cache: one xdist worker runs them all, so no run
# is made twice. The slow matrix is left to spread over the workers.
SHARED_RUNS = pytest.mark.xdist_group("robustness_e2e")
ROBUST = [n for n in aggregators.names() if n not in ("mean", "bulyan", "bucketing")]

# Misses of the 4-point bar measured by benchmarks/robustness.py, each
# explained in docs/robustness.md (ALIE against median-like and Krum-like
# rules, small IPM against Krum, Krum's single-replica noise). The slow test
# runs them as non-strict xfails, so a fix shows up as XPASS.
KNOWN_MISSES = {
    ("median", "alie"),
    ("median", "ipm"),
    ("trimmed_mean", "alie"),
    ("trimmed_mean", "ipm"),
    ("krum", "none"),
    ("krum", "alie"),
    ("krum", "ipm_small"),
    ("geometric_median", "alie"),
    ("centered_clipping", "alie"),
    ("arc", "alie"),  # in front of the trimmed mean, it misses as that does
}


@pytest.fixture(scope="module")
def accuracy_of(cpu_devices, digits):
    x_train, y_train, x_test, y_test = digits

    @functools.cache
    def run(rule: str, attack: str, worker_momentum: float = 0.0) -> float:
        strategy = kpd.PSStrategy(
            devices=cpu_devices[:REPLICAS],
            aggregator=rule,
            num_byzantine=0 if rule == "mean" else F,
            attack=ATTACKS[attack](),
            worker_momentum=worker_momentum,
        )
        # With worker momentum, the same steps from a momentum-free SGD.
        rate, momentum = (0.05, 0.9) if not worker_momentum else (0.5, 0.0)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((64,)),
                    keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(rate, momentum=momentum),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        data = (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train), seed=0)
            .batch(BATCH)
        )
        model.fit(data, epochs=EPOCHS, verbose=0)
        if not all(np.isfinite(w).all() for w in model.get_weights()):
            return 0.0
        # Eagerly on the test set, not `evaluate`: that would trace a test
        # step over the 8 replicas (about 3 s a run) to compute the same.
        logits = model(x_test, training=False)
        return float(np.mean(np.argmax(logits, axis=1) == y_test))

    return run


@SHARED_RUNS
def test_clean_run_learns(accuracy_of):
    assert accuracy_of("mean", "none") > 0.9


# The default run keeps one attack that must break the mean; the large IPM and
# NaN break it as surely, and run with the slow matrix.
@SHARED_RUNS
@pytest.mark.parametrize(
    "attack",
    [
        "sign_flip",
        pytest.param("ipm", marks=pytest.mark.slow),
        pytest.param("nan", marks=pytest.mark.slow),
    ],
)
def test_attack_breaks_the_mean(accuracy_of, attack):
    assert accuracy_of("mean", attack) < accuracy_of("mean", "none") - 0.2


# In the default run, one attack that breaks the mean for each kind of rule
# (coordinate-wise, selection, iterative), on raw gradients; and one cell of
# each rule and attack of issue 39, each rule with worker momentum as
# docs/robustness.md recommends it. The rest is in the slow matrices and
# benchmarks/robustness_protocol.py's tables.
DEFAULT_CELLS = [
    ("median", "nan", 0.0),
    ("krum", "ipm", 0.0),
    ("centered_clipping", "sign_flip", 0.0),
    ("caf", "min_max", 0.9),
    ("smea", "min_sum", 0.9),
    ("mda", "rop", 0.9),
    ("monna", "optimal_label_flip", 0.9),
    ("meamed", "sign_flip", 0.9),
]


@SHARED_RUNS
@pytest.mark.parametrize(("rule", "attack", "worker_momentum"), DEFAULT_CELLS)
def test_robust_rule_holds(accuracy_of, rule, attack, worker_momentum):
    clean = accuracy_of("mean", "none")
    assert accuracy_of(rule, attack, worker_momentum) >= clean - TOLERANCE


@SHARED_RUNS
def test_worker_momentum_holds_where_raw_gradients_fall(accuracy_of):
    """The recommended configuration (docs/robustness.md): the trimmed mean of
    the replicas' momenta holds against ALIE, which beats it on raw gradients
    (here: 95.8 against 89.7, clean mean 96.1)."""
    clean = accuracy_of("mean", "none")
    assert accuracy_of("trimmed_mean", "alie", 0.9) >= clean - TOLERANCE
    assert accuracy_of("trimmed_mean", "alie") < clean - TOLERANCE


@SHARED_RUNS
def test_worker_momentum_recovers_most_of_the_optimal_attack(accuracy_of):
    """Optimal ALIE picks the most damaging shift every step. Here it takes
    the trimmed mean to 63.6 and the momentum run to 90.0 (clean mean 96.1):
    most, not all, recovered. The benchmark's runs of this configuration
    spread as much between seeds and input pipelines (docs/robustness.md,
    "Across seeds and inputs")."""
    clean = accuracy_of("mean", "none")
    raw = accuracy_of("trimmed_mean", "optimal_alie")
    with_momentum = accuracy_of("trimmed_mean", "optimal_alie", 0.9)
    assert raw < clean - 0.2
    assert with_momentum >= clean - 2 * TOLERANCE
    assert with_momentum - raw >= 0.15


@SHARED_RUNS
def test_centered_clipping_with_worker_momentum_needs_a_radius_that_follows_the_spread(
    accuracy_of,
):
    """The scaled sign flip (issue 39's case): with a fixed radius of 1 (the
    default before 0.3),
    worker momentum makes centered clipping lose to it (honest momenta are
    several times shorter than the radius, so each clipped attacker pulls
    the centre by the whole radius, the same way every step); with
    `radius="auto"` (the (n - f)-th closest replica's distance, the default)
    it holds with momentum (without: benchmarks/robustness.py's table)."""
    clean = accuracy_of("mean", "none")
    fixed = accuracy_of("centered_clipping(radius=1.0)", "sign_flip")
    fixed_momentum = accuracy_of("centered_clipping(radius=1.0)", "sign_flip", 0.9)
    auto_momentum = accuracy_of("centered_clipping", "sign_flip", 0.9)
    assert fixed_momentum < fixed - TOLERANCE
    assert auto_momentum >= clean - TOLERANCE
    assert auto_momentum >= fixed_momentum + TOLERANCE


@pytest.mark.slow
# The adaptive attack against every rule is benchmarks/robustness.py's table.
@pytest.mark.parametrize(
    "attack", [a for a in ATTACKS if a != "optimal_alie" and a not in NEW_ATTACKS]
)
@pytest.mark.parametrize("rule", ROBUST)
def test_full_matrix(accuracy_of, rule, attack, request):
    """Every rule under every attack, raw gradients (the new attacks follow)."""
    if (rule, attack) in KNOWN_MISSES:
        request.applymarker(
            pytest.mark.xfail(reason="documented in docs/robustness.md")
        )
    clean = accuracy_of("mean", "none")
    assert accuracy_of(rule, attack) >= clean - TOLERANCE


def test_bucketing_condition_fails_for_this_setup(cpu_devices):
    # 8 replicas in buckets of 2 leave 4 values for 2 bad ones: no honest
    # majority. The strategy says so instead of training a broken rule.
    with pytest.raises(ValueError, match="Bucketing"):
        kpd.PSStrategy(
            devices=cpu_devices[:REPLICAS], aggregator="bucketing", num_byzantine=F
        )


@pytest.mark.slow
@pytest.mark.parametrize("attack", NEW_ATTACKS)
@pytest.mark.parametrize("rule", ROBUST)
def test_full_matrix_of_the_new_attacks_with_worker_momentum(accuracy_of, rule, attack):
    """Issue 39's attacks against every rule with worker momentum, as the
    recommendations run them (docs/robustness.md has each cell's number)."""
    clean = accuracy_of("mean", "none")
    assert accuracy_of(rule, attack, 0.9) >= clean - 2 * TOLERANCE
