"""Contract tests every aggregation rule must pass, plus lookup and serialization.

Every registered rule (`aggregators.names()`, read at collection, so a new rule
joins by registering) goes through one parametrized family: it has a numpy
reference in `tests/reference.py` and matches it, replica order does not
matter, identical inputs give that input, up to f outliers stay out, the
spec's condition on n and f is enforced with a useful error, inputs are not
edited, the SUM of 1/n-scaled inputs means the rule at true scale, the report
has the spec's names and shape `[n]`, and the config round-trips.

`bucketing` permutes its replicas at random and exposes no way to replay the
permutation, so it is matched against the reference under every possible
bucket assignment (`reference.candidates`): the output must equal one of them.
That checks the bucketing itself, which `bucket_size=1` would not, and the
same check is order-independent, so it serves for replica order too.

Speed: a rule is traced (and XLA-compiled) once per input layout, so the
property tests draw n and f from a few layouts per rule, always with the
variable shapes `SHAPES`, and reuse one bound rule per layout.
"""

import functools
import math
import os
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_psdist import aggregators
from keras_psdist.families import AGGREGATORS
from tests import reference
from tests.reference import (
    REFERENCES,
    assert_matches,
    condition,
    reference_for,
    same,
    spec_config,
)

RULES = aggregators.names()
SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
SHAPES = [(3,), (2, 2), ()]  # several variables, one of them a scalar
MAX_REPLICAS = 12
# How far one replica may pull the output, per kind of rule (see `_assert_bounded`).
WHOLE_VECTOR = ("geometric_median", "centered_clipping")
# Rules that may keep an outlier closer to the median than an honest value
# left out: inside the honest range widened by its width on each side.
AROUND_MEDIAN = ("meamed",)
# Wrappers that scale replicas towards 0.
CLIPPING = ("clipping", "arc")
# Rules that carry a state between steps: the reference keyword it feeds.
STATE_KEYWORD = {"centered_clipping": "center"}
STATEFUL = [
    name
    for name in RULES
    if tf.nest.flatten(aggregators.get(name).initial_state([tf.TensorSpec([2])]))
]

# Non-default configurations: every argument the spec gives a rule, and
# wrappers around other inner rules.
VARIANTS = [
    ("multi_krum", {"m": 2}),
    ("geometric_median", {"iterations": 3, "smoothing": 1e-3}),
    ("centered_clipping", {"radius": 0.5, "iterations": 1}),
    ("centered_clipping", {"radius": "auto", "iterations": 2}),
    ("nnm", {"aggregator": "krum"}),
    ("nnm", {"aggregator": "geometric_median"}),
    ("bucketing", {"aggregator": "median", "bucket_size": 3}),
    ("bucketing", {"aggregator": "multi_krum", "bucket_size": 1}),
    ("clipping", {"aggregator": "median", "threshold": 0.5}),
    # Not Krum: clipped to one norm, the replicas are all at the same distance
    # from a zeroed non-finite one, which makes exact ties in Krum's scores.
    ("clipping", {"aggregator": "geometric_median", "threshold": 3.0}),
    ("arc", {"aggregator": "krum"}),
    ("arc", {"aggregator": "geometric_median"}),
    ("arc", {"aggregator": "nnm"}),
]
VARIANTS = [
    (name, config)
    for name, config in VARIANTS
    if name in RULES and config.get("aggregator", "mean") in RULES
]

# More examples for a deeper local run: KERAS_PSDIST_EXAMPLES=200 pytest ...
EXAMPLES = int(os.environ.get("KERAS_PSDIST_EXAMPLES", "10"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)


# ------------------------------------------------------------------ helpers


def _spec(name):
    return spec_config(aggregators.get(name))


def _accepts(name, n, f):
    rule_name, config = _spec(name)
    return condition(rule_name, n, f, **config)


@functools.cache
def _layouts(name, min_f=0):
    """A few valid (n, f): the tight n for f = 0 and 2, one more than it for f = 1.

    Three layouts keep the traces few and still cover both parities of n.
    """
    out = []
    for f, pick in ((0, 0), (1, 1), (2, 0)):
        valid = [n for n in range(1, MAX_REPLICAS + 1) if _accepts(name, n, f)]
        if f >= min_f and len(valid) > pick:
            out.append((valid[pick], f))
    if len(out) == 1:
        out.append((out[0][0] + 3, out[0][1]))  # e.g. mean: f = 0 only
    return tuple(out) or _layouts(name, 0)


@functools.cache
def _bound(name, n, f):
    """One bound rule per layout, so each layout is traced once per session."""
    return aggregators.get(name).bind(n, f)


def _columns(arrays):
    """`per_replica[v][r]` tensors from one `(n, *shape)` array per variable."""
    return [[tf.constant(row) for row in a] for a in arrays]


def _specs(arrays):
    return [tf.TensorSpec(a.shape[1:], tf.float32) for a in arrays]


def _numpy(tensors):
    return [np.asarray(t) for t in tensors]


def _apply(rule, arrays, state=None):
    state = rule.initial_state(_specs(arrays)) if state is None else state
    result = rule.apply(_columns(arrays), state)
    report = {k: np.asarray(v) for k, v in result.report.items()}
    return _numpy(result.values), report, result.state


def _scale_of(arrays, honest=None):
    finite = [a[np.isfinite(a)] if honest is None else a[honest] for a in arrays]
    return max([1e-3] + [float(np.abs(a).max()) for a in finite if a.size])


def _trusted(name):
    """The replicas a rule needs honest (MoNNA's reference), as its default
    configuration has them."""
    return tuple(getattr(aggregators.get(name), "trusted_replicas", ()))


class Case(NamedTuple):
    n: int
    f: int
    arrays: list  # one float32 `(n, *shape)` array per variable
    honest: np.ndarray  # `[n]` bool


@st.composite
def cases(
    draw, name, poisons=("nan", "inf", "-inf", "far"), min_bad=0, grid=None, layout=None
):
    """Inputs for `name`: a layout, values, and up to f poisoned replicas.

    Values are either small integers (float32 arithmetic on them is exact, so
    ties are exact and the spec's tie-breaking is exercised) or seeded normals
    at a drawn scale (no ties, so float32 and float64 agree on every choice).
    """
    if layout is None:
        layout = draw(st.sampled_from(_layouts(name, min_f=min(min_bad, 1))))
    n, f = layout
    if grid is None:
        grid = draw(st.booleans())
    if grid:
        arrays = [
            draw(hnp.arrays(np.int8, (n, *s), elements=st.integers(-4, 4)))
            for s in SHAPES
        ]
        arrays = [a.astype(np.float32) for a in arrays]
        scale = 4.0
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        scale = draw(st.sampled_from([1e-2, 1.0, 1e2]))
        arrays = [(scale * rng.normal(size=(n, *s))).astype(np.float32) for s in SHAPES]
    honest = np.ones(n, bool)
    most = f if poisons else 0
    # A rule with a trusted replica (MoNNA's reference) needs it honest.
    trusted = _trusted(name)
    order = [r for r in draw(st.permutations(range(n))) if r not in trusted]
    bad = order[: draw(st.integers(min(min_bad, most), most))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    for r in bad:
        honest[r] = False
        poison = draw(st.sampled_from(poisons))
        for a in arrays:
            if poison == "far":  # finite but far: squares stay in float32 range
                a[r] = 1e4 * scale * rng.normal(size=a.shape[1:])
            elif poison == "1e30":  # huge, either sign
                a[r] = 1e30 * rng.choice([-1.0, 1.0], size=a.shape[1:])
            elif poison == "-1e30":
                a[r] = -1e30
            else:
                hit = rng.random(a.shape[1:]) < 0.5
                a[r] = np.where(hit, np.float32(poison), a[r])
        if poison not in ("far", "1e30", "-1e30"):
            arrays[0][r].flat[0] = np.float32(poison)  # at least one coordinate
    return Case(n, f, arrays, honest)


# ------------------------------------------------------------- the contract


@pytest.mark.parametrize("name", RULES)
def test_every_rule_has_a_numpy_reference(name):
    assert name in REFERENCES, (
        f"add a numpy reference for {name!r} to tests/reference.py"
    )
    assert _layouts(name), f"{name!r} accepts no n <= {MAX_REPLICAS}"


@pytest.mark.parametrize("name", RULES)
@PROPERTY
@given(data=st.data())
def test_matches_numpy_reference(name, data):
    case = data.draw(cases(name))
    rule = _bound(name, case.n, case.f)
    values, report, _ = _apply(rule, case.arrays)
    assert set(report) == set(rule.report_names)
    for key, value in report.items():
        assert value.shape == (case.n,) and value.dtype == np.float32, key
    scale = _scale_of(case.arrays, case.honest)
    assert_matches(rule, case.arrays, values, report, scale)


def test_smea_may_average_any_subset_tied_in_exact_arithmetic():
    # Every subset of 3 holds two equal values and one apart: one top
    # eigenvalue, which float32 and float64 round apart differently. TF took
    # replicas (0, 2, 3), the reference (0, 1, 2), in a drawn case that
    # failed `test_matches_numpy_reference[smea]` once.
    arrays = [
        np.zeros((4, 3), np.float32),
        np.ones((4, 2, 2), np.float32),
        np.array([1.0, 1.0, 0.0, 0.0], np.float32),
    ]
    assert reference.smea_ties(arrays, 1) == [
        (0, 1, 2),
        (0, 1, 3),
        (0, 2, 3),
        (1, 2, 3),
    ]
    rule = _bound("smea", 4, 1)
    values, report, _ = _apply(rule, arrays)
    assert_matches(rule, arrays, values, report, scale=1.0)


@pytest.mark.parametrize("name", RULES)
def test_report_names_are_the_specs(name):
    rule = aggregators.get(name)
    rule_name, config = spec_config(rule)
    while rule_name in reference.WRAPPERS:  # a wrapper reports its inner rule's
        rule_name, config = config.get("inner", ("trimmed_mean", {}))
    assert tuple(rule.report_names) == reference.REPORT_NAMES[rule_name]


@pytest.mark.parametrize("name", RULES)
@PROPERTY
@given(data=st.data())
def test_replica_order_does_not_matter(name, data):
    # Finite inputs without chance ties. The spec still breaks structural ties
    # by replica index (Krum with n - f - 2 = 1 scores a mutual nearest pair
    # alike), so both orders are held to the reference, and to each other
    # wherever the reference gives both orders the same result. Bucketing's
    # candidate set does not depend on the order, so matching it is the check.
    case = data.draw(cases(name, poisons=("far",), grid=False))
    rule = _bound(name, case.n, case.f)
    # A trusted replica (MoNNA's reference) keeps its place: the order of
    # the others is what must not matter.
    trusted = _trusted(name)
    others = [r for r in range(case.n) if r not in trusted]
    moved = iter(data.draw(st.permutations(others)))
    order = [r if r in trusted else next(moved) for r in range(case.n)]
    shuffled = [a[order] for a in case.arrays]
    scale = _scale_of(case.arrays, case.honest)
    values = _numpy(rule.aggregate(_columns(case.arrays)))
    values_shuffled = _numpy(rule.aggregate(_columns(shuffled)))
    assert_matches(rule, shuffled, values_shuffled, scale=scale)
    ref = reference_for(rule)
    if name != "bucketing" and same(ref(case.arrays), ref(shuffled), scale):
        assert same(values, values_shuffled, scale), (values, values_shuffled)


@pytest.mark.parametrize("name", RULES)
@PROPERTY
@given(data=st.data())
def test_identical_inputs_give_that_input(name, data):
    # That input, or for a static clipping that input clipped to its threshold.
    case = data.draw(cases(name, poisons=()))
    rule = _bound(name, case.n, case.f)
    copies = [np.repeat(a[:1], case.n, axis=0) for a in case.arrays]
    values = _numpy(rule.aggregate(_columns(copies)))
    expected = reference.identical_output(rule, [a[0] for a in copies])
    scale = _scale_of(copies)
    for got, want in zip(values, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale)


def _assert_bounded(rule, case, values):
    """Outliers do not pull the output away from the honest replicas.

    Coordinate-wise rules (and selecting ones, whose output is an average of
    honest replicas) stay inside the honest values' range at every coordinate;
    the mean around the median inside that range widened by its width on each
    side (a kept value is no farther from the median, which lies in the honest
    range, than the farthest honest value: the n - f closest include values at
    most that far).
    Geometric median and centered clipping only keep the norm bounded. Both
    start from the coordinate-wise median, of norm at most sqrt(d) * M (M the
    honest replicas' largest norm, d the full vector's length). A clipped step
    keeps the honest part within max(|v|, M) and moves at most f * radius / n
    for the outliers (with `radius="auto"`, the default, the radius is at most
    the farthest honest replica's distance, |v| + M). A Weiszfeld step gives a far (or non-finite) outlier a
    pull of at most f / (n - f) = rho of the honest one's reach |z| + M, so
    |z'| <= M + rho * (|z| + M), whose fixed point is n / (n - 2f) * M.
    """
    inner_name, config = spec_config(rule)
    clips = False
    while inner_name in reference.WRAPPERS:
        clips = clips or inner_name in CLIPPING
        inner_name, config = config.get("inner", ("trimmed_mean", {}))
    for got in values:
        assert np.isfinite(got).all(), f"non-finite output {got}"
    honest = [a[case.honest] for a in case.arrays]
    if clips:
        # Clipping scales the honest values towards 0 (and zeroes non-finite
        # replicas): the range that holds them includes 0.
        honest = [np.concatenate([h, np.zeros_like(h[:1])]) for h in honest]
    if inner_name not in WHOLE_VECTOR:
        for got, h in zip(values, honest, strict=True):
            slack = 1e-5 * np.abs(h).max(initial=1.0)
            lo, hi = h.min(axis=0), h.max(axis=0)
            if inner_name in AROUND_MEDIAN:
                lo, hi = lo - (hi - lo), hi + (hi - lo)
            assert (got >= lo - slack).all(), (got, h)
            assert (got <= hi + slack).all(), (got, h)
        return
    n, f = case.n, case.f
    flat = np.concatenate([h.reshape(len(h), -1) for h in honest], axis=1)
    biggest = np.linalg.norm(flat, axis=1).max()
    d = flat.shape[1]
    factor = max(math.sqrt(d), n / (n - 2 * f))
    radius, iterations = config.get("radius", "auto"), config.get("iterations", 3)
    if radius == "auto":
        # The (n - f)-th closest distance is at most the farthest honest
        # replica's, |v| + M: each iteration grows the bound B to
        # B + f / n * (B + M).
        bound = factor * biggest
        for _ in range(iterations):
            bound += f / n * (bound + biggest)
        bound = 1.01 * bound + 1e-4
    else:
        clipping = radius * iterations * f / n
        bound = 1.01 * factor * biggest + clipping + 1e-4  # 1%: float32 round-off
    got = np.linalg.norm(np.concatenate([v.ravel() for v in values]))
    assert got <= bound, f"|output| = {got} > {bound} (honest max norm {biggest})"


@pytest.mark.parametrize("name", RULES)
@PROPERTY
@given(data=st.data())
def test_outliers_stay_bounded(name, data):
    poisons = ("1e30", "-1e30", "nan", "inf", "-inf")
    case = data.draw(cases(name, poisons=poisons, min_bad=1))
    rule = _bound(name, case.n, case.f)
    _assert_bounded(rule, case, _numpy(rule.aggregate(_columns(case.arrays))))


@pytest.mark.parametrize("name", RULES)
def test_condition_on_n_and_f_is_enforced(name):
    # The spec's error: names the rule (a wrapper, or its inner rule), the
    # received n and f, and the fix, e.g. "Krum needs at least 2 *
    # num_byzantine + 3 = 7 replicas. Received: 6 replicas, num_byzantine=2.
    # Add replicas or lower num_byzantine."
    rule = aggregators.get(name)
    names = {name, type(rule).__name__}
    if hasattr(rule, "aggregator"):
        names.add(type(aggregators.get(rule.aggregator)).__name__)
    wrong = []
    for n in range(1, MAX_REPLICAS + 1):
        for f in range(0, 5):
            if _accepts(name, n, f):
                assert rule.bind(n, f).num_byzantine == f
                continue
            with pytest.raises(ValueError) as error:
                rule.bind(n, f)
            message = str(error.value)
            assert f"num_byzantine={f}" in message, message
            if name == "mean":
                continue  # its own message, see test_mean_refuses_byzantine_replicas
            if not (
                any(x in message for x in names)
                and f"Received: {n} replicas, num_byzantine={f}" in message
                and "lower num_byzantine" in message
            ):
                wrong.append(f"n={n}, f={f}: {message}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", RULES)
def test_bind_refuses_a_different_num_byzantine(name):
    rule = type(aggregators.get(name)).from_config(
        {**aggregators.get(name).get_config(), "num_byzantine": 1}
    )
    with pytest.raises(ValueError, match="num_byzantine=1.*num_byzantine=2"):
        rule.bind(MAX_REPLICAS, 2)
    if _accepts(name, MAX_REPLICAS, 1):
        assert rule.bind(MAX_REPLICAS).num_byzantine == 1
        assert rule.bind(MAX_REPLICAS, 1).num_byzantine == 1


@pytest.mark.parametrize("name", RULES)
def test_does_not_edit_its_input(name):
    n, f = _layouts(name, min_f=1)[0]
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(n, *s)).astype(np.float32) for s in SHAPES]
    if f:
        arrays[0][0, 0] = np.nan
    variables = [[tf.Variable(row) for row in a] for a in arrays]
    outer, columns = list(variables), [list(column) for column in variables]
    _bound(name, n, f).aggregate(variables)
    assert all(x is y for x, y in zip(variables, outer, strict=True))  # same lists
    for column, before, a in zip(variables, columns, arrays, strict=True):
        assert all(x is y for x, y in zip(column, before, strict=True))
        np.testing.assert_array_equal(np.stack([v.numpy() for v in column]), a)


@pytest.mark.parametrize("name", RULES)
@PROPERTY
@given(data=st.data())
def test_sum_of_scaled_inputs_means_the_rule_at_true_scale(name, data):
    # Keras sends gradients scaled by 1/n and asks for their SUM; MEAN sends
    # them at true scale. Both must give the rule's estimate at true scale.
    case = data.draw(cases(name, poisons=("far", "nan"), grid=False))
    rule = _bound(name, case.n, case.f)
    scale = _scale_of(case.arrays, case.honest)
    scaled = [a / np.float32(case.n) for a in case.arrays]
    values = _numpy(rule.reduce(SUM, _columns(scaled)))
    assert_matches(rule, case.arrays, values, scale=scale)
    values = _numpy(rule.reduce(MEAN, _columns(case.arrays)))
    assert_matches(rule, case.arrays, values, scale=scale)


@pytest.mark.parametrize("name", STATEFUL)
@PROPERTY
@given(data=st.data())
def test_state_carries_to_the_next_step(name, data):
    first = data.draw(cases(name, grid=False))
    rule = _bound(name, first.n, first.f)
    second = data.draw(cases(name, grid=False, layout=(first.n, first.f)))
    values, _, state = _apply(rule, first.arrays)
    again, report, _ = _apply(rule, second.arrays, state)
    assert name in STATE_KEYWORD, f"say which reference keyword {name!r}'s state feeds"
    extra = {STATE_KEYWORD[name]: values}
    # The rule works relative to its state (centered clipping returns
    # center + clip(x - center)), so float32's rounding grows with the
    # state's magnitude too: a center of 37 and inputs of 0.004 came back
    # 3e-6 off, a few float32 ulps of 37. The absolute tolerance (1e-4 x
    # scale) allows 1e-6 x the state's magnitude for it, and no more.
    state = max(
        [
            float(np.abs(v[np.isfinite(v)]).max())
            for v in values
            if np.isfinite(v).any()
        ],
        default=0.0,
    )
    scale = max(_scale_of(second.arrays, second.honest), 1e-2 * state)
    assert_matches(rule, second.arrays, again, report, scale, **extra)


def _variant_id(variant):
    name, config = variant
    return name + "".join(f"-{k}={v}" for k, v in config.items())


@functools.cache
def _variant(name, items, f=None):
    rule = aggregators.get({"class_name": name, "config": dict(items)})
    if f is None:
        return rule
    rule_name, config = spec_config(rule)
    n = next(n for n in range(1, 13) if condition(rule_name, n, f, **config))
    return rule.bind(n, f)


@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
@settings(PROPERTY, max_examples=max(EXAMPLES // 2, 1))
@given(data=st.data())
def test_variant_matches_numpy_reference(variant, data):
    # Seeded normals only: a wrapper may hand its inner rule the replicas in
    # a random order, and the inner rule breaks exact ties by that order.
    name, config = variant
    rule = _variant(name, tuple(config.items()), f=1)
    case = data.draw(cases(name, grid=False, layout=(rule.num_replicas, rule.f)))
    values, report, _ = _apply(rule, case.arrays)
    scale = _scale_of(case.arrays, case.honest)
    assert_matches(rule, case.arrays, values, report, scale)


@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
def test_variant_condition_and_config(variant):
    name, config = variant
    rule = _variant(name, tuple(config.items()))
    rule_name, spec = spec_config(rule)
    assert all(spec[k] == v for k, v in config.items() if k in spec)
    for n in range(1, MAX_REPLICAS + 1):
        for f in range(0, 4):
            if condition(rule_name, n, f, **spec):
                rule.bind(n, f)
            else:
                with pytest.raises(ValueError, match=f"num_byzantine={f}"):
                    rule.bind(n, f)
    again = aggregators.deserialize(aggregators.serialize(rule))
    assert again.get_config() == rule.get_config()


@pytest.mark.parametrize("name", RULES)
def test_serialize_round_trip(name):
    n, f = _layouts(name)[-1]
    for rule in (aggregators.get(name), _bound(name, n, f)):
        config = aggregators.serialize(rule)
        assert config["class_name"] == name
        again = aggregators.deserialize(config)
        assert type(again) is type(rule) and again.get_config() == rule.get_config()
        assert aggregators.get(config).get_config() == rule.get_config()


# ----------------------------------------------------- rule-specific checks


def test_mean_refuses_byzantine_replicas():
    with pytest.raises(
        ValueError, match="tolerates no Byzantine replica.*num_byzantine=1"
    ):
        aggregators.get("mean").check(num_replicas=4, num_byzantine=1)


def test_references_agree_with_the_specs_examples():
    # Hand-computed from docs/aggregation_rules.md, to check the references.
    x = [np.array([[0.0], [1.0], [2.0], [3.0], [100.0]])]
    assert reference.median(x)[0].tolist() == [2.0]
    assert reference.median([x[0][:4]])[0].tolist() == [1.5]
    assert reference.trimmed_mean(x, f=1)[0].tolist() == [2.0]
    # Krum, f=1: n-f-2 = 2 nearest; scores 1+4, 1+1, 1+1, 1+4, 97^2+98^2.
    values, report = reference.krum(x, f=1, report=True)
    assert values[0].tolist() == [1.0]  # replicas 1 and 2 tie: the lower index
    assert report["selected"].tolist() == [0, 1, 0, 0, 0]
    values, report = reference.multi_krum(x, f=1, m=3, report=True)
    assert values[0].tolist() == [1.0]
    assert report["selected"].tolist() == [1, 1, 1, 0, 0]
    nan = [np.array([[np.nan], [1.0], [2.0], [3.0], [4.0]])]
    assert reference.median(nan, f=1)[0].tolist() == [3.0]  # NaN sorts as +inf
    assert reference.krum(nan, f=1)[0].tolist() == [2.0]
    # Non-finite replica: zeros and weight 0 in whole-vector rules.
    values, report = reference.geometric_median(nan, f=1, report=True)
    assert report["weight"][0] == 0.0 and 1.0 < values[0][0] < 4.0
    # Bulyan, n=7, f=1: theta=5, beta=3: the 3 selected values nearest the median.
    y = [np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [50.0], [-60.0]])]
    values, report = reference.bulyan(y, f=1, report=True)
    assert report["selected"].tolist() == [1, 1, 1, 1, 1, 0, 0]
    assert values[0].tolist() == [2.0]
    # Bucketing with bucket_size=1 is the inner rule; buckets of 2 average pairs.
    assert reference.bucketing(x, f=1, bucket_size=1)[0].tolist() == [2.0]
    pairs = reference.bucketing(x, f=0, bucket_size=2, permutation=[4, 0, 1, 2, 3])
    assert pairs[0].tolist() == [np.mean([50.0, 1.5, 3.0])]
    assert len(list(reference.bucket_orders(5, 2))) == 15
    # NNM, f=1: each replica becomes the mean of its 4 nearest.
    mixed = reference.nnm(x, f=1, inner="mean")
    assert np.allclose(mixed[0], np.mean([1.5, 1.5, 1.5, 1.5, 26.5]))


def test_get_accepts_string_dict_and_instance():
    rule = aggregators.Mean()
    assert aggregators.get(rule) is rule
    assert isinstance(aggregators.get("mean"), aggregators.Mean)
    assert isinstance(
        aggregators.get({"class_name": "mean", "config": {}}), aggregators.Mean
    )


def test_unknown_name_lists_valid_ones():
    with pytest.raises(
        ValueError, match=r"Unknown aggregator 'krumm'\. Expected one of: mean"
    ):
        aggregators.get("krumm")


def test_bad_identifier_type():
    with pytest.raises(ValueError, match="Received: 3"):
        aggregators.get(3)


def test_user_rule_can_be_registered():
    class FirstReplica(aggregators.Aggregator):
        def aggregate(self, per_replica):
            return [tf.identity(vs[0]) for vs in per_replica]

    aggregators.register("first_replica_for_test", FirstReplica)
    try:
        rule = aggregators.get("first_replica_for_test")
        [out] = rule.aggregate([[tf.constant([1.0]), tf.constant([9.0])]])
        assert out.numpy().tolist() == [1.0]
        assert aggregators.serialize(rule)["class_name"] == "first_replica_for_test"
        assert rule.name == "first_replica_for_test"
        with pytest.raises(ValueError, match="already registered"):
            aggregators.register("first_replica_for_test", aggregators.Mean)
    finally:
        AGGREGATORS.unregister("first_replica_for_test")


def test_register_refuses_non_aggregators():
    with pytest.raises(TypeError, match="Aggregator subclass"):
        aggregators.register("x", dict)


def test_monna_averages_the_neighbours_of_its_reference():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(7, *shape)).astype(np.float32) for shape in SHAPES]
    arrays[0][3] += 50.0  # far from everyone: not a neighbour of replica 5
    rule = aggregators.get({"class_name": "monna", "config": {"reference": 5}})
    rule = rule.bind(7, 2)
    values, report, _ = _apply(rule, arrays)
    want, want_report = reference.monna(arrays, f=2, reference=5, report=True)
    assert report["selected"][5] == 1.0 and report["selected"][3] == 0.0
    np.testing.assert_array_equal(report["selected"], want_report["selected"])
    for got, expected in zip(values, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"reference is replica 5.*only 4 replicas"):
        aggregators.get({"class_name": "monna", "config": {"reference": 5}}).bind(4, 1)


def test_meamed_keeps_the_closest_values_not_the_first_narrowest_window():
    # n = 5, f = 2, median 5, distances 5 5 0 1 15: the three closest are 5,
    # 6 and one 0 (mean 11/3). The windows [0, 0, 5] and [0, 5, 6] are both
    # 5 wide: taking the first narrowest one would drop 6 for a 0 (5/3).
    rule = aggregators.get("meamed").bind(5, 2)
    column = np.array([[20.0], [0.0], [6.0], [0.0], [5.0]], np.float32)
    values, _, _ = _apply(rule, [column])
    np.testing.assert_allclose(values[0], [11 / 3], rtol=1e-6)
    np.testing.assert_allclose(reference.meamed([column], f=2)[0], [11 / 3])


def test_meamed_breaks_ties_by_value_not_by_replica_order():
    # Median 0.5 of (-1, 0, 1, 2): 0 and 1 are closest, then -1 and 2 at 1.5;
    # f = 1 keeps three: the lower of the tied pair, whichever replica has it.
    rule = aggregators.get("meamed").bind(4, 1)
    want = (-1.0 + 0.0 + 1.0) / 3
    for order in ([-1.0, 0.0, 1.0, 2.0], [2.0, 1.0, 0.0, -1.0], [0.0, 2.0, -1.0, 1.0]):
        column = np.array(order, np.float32)[:, None]
        values, report, _ = _apply(rule, [column])
        np.testing.assert_allclose(values[0], [want], atol=1e-7)
        np.testing.assert_allclose(reference.meamed([column], f=1)[0], [want])
        # Left out: the replica holding 2 (strictly above the kept -1..1).
        assert report["excluded_fraction"].tolist() == [float(v == 2.0) for v in order]


def test_meamed_report_counts_only_values_outside_the_kept_range():
    # Column 0: three equal values, one kept twice over -> nobody excluded
    # there; column 1: 100 is left out. Weighted by size: 100's replica 1/2.
    rule = aggregators.get("meamed").bind(3, 1)
    column = np.array([[1.0, 0.0], [1.0, 100.0], [1.0, 1.0]], np.float32)
    values, report, _ = _apply(rule, [column])
    np.testing.assert_allclose(values[0], [1.0, 0.5])
    np.testing.assert_allclose(report["excluded_fraction"], [0.0, 0.5, 0.0])
