"""The gradient path as a chain of stages (`keras_psdist.gradients`), and the
one spelling of a configuration (`keras_psdist.spelling`).

Contract tests for every stage (init / apply shapes, the state through
variables and back), numpy references where a stage computes, the order a
chain runs in, a toy stage inserted in the path, and the vocabulary the
strategies, `aggregators.get`, the CLI and the benchmarks share.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks, gradients, spelling
from keras_psdist.gradients import Replicas
from keras_psdist.gradients.stage import assign, read
from tests import reference

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
N, F = 6, 1


def _values(seed=0, n=N, shapes=((3,), (2, 2))):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(n, *shape)).astype(np.float32) for shape in shapes]
    arrays[0][-1] *= 50.0  # one far replica
    return arrays, [[tf.constant(a[r]) for r in range(n)] for a in arrays]


def _specs(columns):
    return [tf.TensorSpec(c[0].shape, c[0].dtype) for c in columns]


def _stage_cases():
    bound = lambda text: aggregators.get(text).bind(N, F)  # noqa: E731
    return {
        "momentum": gradients.Momentum(0.5, N),
        "compression_top_k": gradients.Compression(kpd.compression.TopK(0.5), N),
        "compression_random_k": gradients.Compression(
            kpd.compression.RandomK(0.5, seed=1), N
        ),
        "compression_sign": gradients.Compression(kpd.compression.Sign(), N),
        "compression_fp16": gradients.Compression(kpd.compression.FP16(), N),
        "attack": gradients.Attacked(attacks.SignFlip(replicas=[N - 1])),
        "nnm": gradients.Transform(bound("nnm>krum")),
        "bucketing": gradients.Transform(bound("bucketing(seed=1)>median")),
        "clipping": gradients.Transform(bound("clipping(threshold=2.0)>median")),
        "arc": gradients.Transform(bound("arc>median")),
        "rule": gradients.Rule(bound("median")),
        "stateful_rule": gradients.Rule(bound("centered_clipping")),
    }


@pytest.mark.parametrize("name", list(_stage_cases()))
def test_stage_contract_state_structure_and_round_trip(name):
    """`init` gives a nest of tensors, `apply` the next state of the same
    structure and dtypes; through variables (`apply_in_place`) the same
    values as `apply`."""
    stage = _stage_cases()[name]
    path = gradients.chain(stage, gradients.Rule(aggregators.get("median").bind(N, F)))
    if isinstance(stage, gradients.Rule):
        path = gradients.chain(stage)
    _, columns = _values()
    state = path.init(_specs(columns))
    for tensor in tf.nest.flatten(state):
        assert isinstance(tensor, tf.Tensor)
    out, new = path.apply(Replicas(columns, MEAN), state)
    tf.nest.assert_same_structure(state, new)
    for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(new), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert isinstance(out, aggregators.Aggregation)
    assert [v.shape for v in out.values] == [c[0].shape for c in columns]

    variables = tf.nest.map_structure(tf.Variable, state)
    in_place = path.apply_in_place(Replicas(columns, MEAN), variables)
    if name != "bucketing":  # a fresh shuffle each call
        for a, b in zip(out.values, in_place.values, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    for var, value in zip(
        tf.nest.flatten(variables), tf.nest.flatten(new), strict=True
    ):
        np.testing.assert_allclose(var.numpy(), value.numpy(), rtol=1e-6)
    assign(variables, state)
    for a, b in zip(
        tf.nest.flatten(read(variables)), tf.nest.flatten(state), strict=True
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(
    "text, reference_fn",
    [
        ("clipping(threshold=2.0)>trimmed_mean", lambda x: reference.clipping(x, f=F, threshold=2.0, inner="trimmed_mean")),
        ("arc>median", lambda x: reference.arc(x, f=F, inner="median")),
        ("nnm>krum", lambda x: reference.nnm(x, f=F, inner="krum")),
        ("arc>nnm>trimmed_mean", lambda x: reference.arc(x, f=F, inner=lambda v, **k: reference.nnm(v, inner="trimmed_mean", **k))),
    ],
)  # fmt: skip
def test_transform_stages_match_the_numpy_references(text, reference_fn):
    arrays, columns = _values()
    path = gradients.gradient_path(aggregators.get(text).bind(N, F), num_replicas=N)
    assert [type(s) for s in path.stages][-1] is gradients.Rule
    out, _ = path.apply(Replicas(columns, MEAN), path.init(_specs(columns)))
    for got, want in zip(out.values, reference_fn(arrays), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_momentum_stage_matches_numpy_over_steps():
    beta = 0.75
    path = gradients.chain(
        gradients.Momentum(beta, N), gradients.Rule(aggregators.Mean().bind(N))
    )
    momenta = None
    state = None
    for step in range(3):
        arrays, columns = _values(seed=step)
        momenta = [
            (1 - beta) * a if momenta is None else beta * m + (1 - beta) * a
            for m, a in zip(momenta or arrays, arrays, strict=True)
        ]
        # As Keras sends them: scaled by 1/n for a SUM.
        scaled = [[v / N for v in column] for column in columns]
        if state is None:
            state = path.init(_specs(columns))
        out, state = path.apply(Replicas(scaled, SUM), state)
        for got, m in zip(out.values, momenta, strict=True):
            np.testing.assert_allclose(got.numpy(), m.mean(axis=0), rtol=1e-5)


class _Log(gradients.Stage):
    """Appends its name to a shared log and adds `offset` to every value."""

    def __init__(self, log, name, offset):
        self.log, self.name, self.offset = log, name, offset

    def init(self, specs):
        return tf.constant(0)

    def apply(self, replicas, state, *, downstream=None):
        self.log.append(self.name)
        dense = replicas.dense()
        values = [[v + self.offset for v in c] for c in dense.values]
        return dense.with_values(values), state + 1


class _Scale(gradients.Stage):
    """A toy stage: every replica's values times `factor` (as a compressor
    would sit between the momentum and the attack)."""

    def __init__(self, factor):
        self.factor = factor

    def apply(self, replicas, state, *, downstream=None):
        dense = replicas.dense()
        values = [[v * self.factor for v in c] for c in dense.values]
        return dense.with_values(values), state


def test_chain_runs_in_order_nests_flat_and_keeps_a_state_per_stage():
    log = []
    a, b, c = (_Log(log, name, 1.0) for name in "abc")
    rule = gradients.Rule(aggregators.Mean())
    path = gradients.chain(a, gradients.chain(b, c), rule)
    assert path.stages == (a, b, c, rule)
    _, columns = _values()
    state = path.init(_specs(columns))
    assert len(state) == 4
    out, state = path.apply(Replicas(columns, MEAN), state)
    assert log == ["a", "b", "c"]
    assert [int(s) for s in state[:3]] == [1, 1, 1]
    mean = np.mean([v.numpy() for v in columns[0]], axis=0)
    np.testing.assert_allclose(out.values[0].numpy(), mean + 3.0, rtol=1e-5)


def test_order_matters_scale_before_clipping_is_not_clipping_before_scale():
    _, columns = _values()
    clip = aggregators.get("clipping(threshold=1.0)>mean").bind(N)
    first = gradients.chain(_Scale(10.0), *gradients.stages_of(clip))
    last = gradients.chain(
        *gradients.stages_of(clip)[:-1], _Scale(10.0), gradients.Rule(clip.aggregator)
    )
    norms = []
    for path in (first, last):
        out, _ = path.apply(Replicas(columns, MEAN), path.init(_specs(columns)))
        norms.append(np.sqrt(sum(np.sum(v.numpy() ** 2) for v in out.values)))
    assert norms[0] <= 1.0 + 1e-5 < norms[1]


def test_a_toy_stage_inserted_between_momentum_and_attack():
    """What a compressor will be: one more stage, with no change elsewhere."""
    arrays, columns = _values()
    rule = aggregators.get("median").bind(N, F)
    path = gradients.gradient_path(
        rule,
        num_replicas=N,
        worker_momentum=0.5,
        attack=attacks.SignFlip(replicas=[N - 1]),
    )
    momentum, attack, last = path.stages
    scaled = gradients.chain(momentum, _Scale(2.0), attack, last)
    out, _ = scaled.apply(Replicas(columns, MEAN), scaled.init(_specs(columns)))
    # Momentum 0.5 from zero, times 2: the gradients; the attacker flipped.
    attacked = [a.copy() for a in arrays]
    for a in attacked:
        a[-1] = -a[-1]
    want = reference.median(attacked, f=F)
    for got, w in zip(out.values, want, strict=True):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-5)


@pytest.mark.parametrize(
    "text", ["arc>median", "nnm>krum", "bucketing(seed=3)>trimmed_mean", "nnm>median"]
)
@pytest.mark.parametrize("with_attack", [False, True])
def test_the_chain_gives_what_the_composed_aggregator_gives(text, with_attack):
    """Bit for bit: SUM-scaled inputs, uneven shares, an attack in front."""
    _, columns = _values()
    scaled = [[v / N for v in c] for c in columns]
    shares = [tf.constant(s) for s in (0.2, 0.2, 0.2, 0.2, 0.2, 0.0)]
    rule = aggregators.get(text).bind(N, F)
    attack = attacks.SignFlip(replicas=[0]) if with_attack else None
    composed = rule if attack is None else attacks.UnderAttack(rule, attack)
    tf.random.set_seed(0)
    want = composed.step(SUM, scaled, shares=shares)
    path = gradients.gradient_path(rule, num_replicas=N, attack=attack)
    tf.random.set_seed(0)
    got, _ = path.apply(Replicas(scaled, SUM, shares), path.init(_specs(columns)))
    for g, w in zip(got.values, want.values, strict=True):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    for name in want.report:
        np.testing.assert_array_equal(
            got.report[name].numpy(), want.report[name].numpy()
        )


def test_nnm_before_an_order_statistic_stays_one_stage():
    path = gradients.gradient_path(
        aggregators.get("nnm>median").bind(N, F), num_replicas=N
    )
    assert [type(s) for s in path.stages] == [gradients.Rule]
    path = gradients.gradient_path(
        aggregators.get("nnm>krum").bind(N, F), num_replicas=N
    )
    assert [type(s) for s in path.stages] == [gradients.Transform, gradients.Rule]


def test_chain_refuses_what_is_not_a_stage():
    with pytest.raises(ValueError, match="`chain` takes stages"):
        gradients.chain(aggregators.Mean())
    with pytest.raises(ValueError, match="at least one stage"):
        gradients.chain()


# ---------------------------------------------------------------- spelling


@pytest.mark.parametrize(
    "text",
    [
        "median",
        "nnm>trimmed_mean",
        "arc>geometric_median",
        "nnm>arc>centered_clipping(radius=0.5)",
        "bucketing(bucket_size=3;seed=0)>krum",
        "clipping(threshold=2.0)>multi_krum(m=3)",
        "trimmed_mean(num_byzantine=1)",
    ],
)
def test_get_reads_every_configuration_and_spell_and_serialize_round_trip(text):
    rule = aggregators.get(text)
    config = aggregators.serialize(rule)
    assert aggregators.serialize(aggregators.deserialize(config)) == config
    assert aggregators.serialize(aggregators.get(aggregators.spell(rule))) == config
    assert spelling.parse(text).rule == text.split(">")[-1].split("(")[0]


def test_spell_leaves_out_defaults_and_matches_the_written_string():
    assert aggregators.spell(aggregators.get("nnm>trimmed_mean")) == "nnm>trimmed_mean"
    assert (
        aggregators.spell(aggregators.ARC("geometric_median")) == "arc>geometric_median"
    )
    assert aggregators.spell(aggregators.get("nnm")) == "nnm>trimmed_mean"
    assert (
        spelling.spell_config(spelling.parse("arc>median+wm").aggregator, 0.9)
        == "arc>median+wm"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("nmn>median", "Unknown pre-aggregation 'nmn' in 'nmn>median'. Expected one of: nnm, bucketing, clipping, arc. Did you mean 'nnm'?"),
        ("nnm>krumm", "Unknown rule 'krumm' in 'nnm>krumm'. Expected one of: mean, median,"),
        ("krumm", "Unknown aggregator 'krumm'. Expected one of: mean,"),
        ("median>nnm", "The rule goes last in 'median>nnm': 'nnm' is a pre-aggregation"),
        ("median>krum", "'median' in 'median>krum' is a rule"),
        ("nnm>>median", "Cannot read an empty stage in 'nnm>>median'"),
        ("nnm(3)>median", "Cannot read the argument '3' of 'nnm'"),
        ("median+wx", "Unknown suffix '+wx' in 'median+wx'"),
        ("median+wm1.5", "must be in [0, 1)"),
        ("nnm(aggregator=mean)>median", "write the rule after '>'"),
        ("bucketing(bucket=2)>median", "unknown argument 'bucket' (did you mean 'bucket_size'?)"),
        ("median+wm", "ends with worker momentum, which the strategy keeps"),
    ],
)  # fmt: skip
def test_a_bad_configuration_names_the_bad_part_and_the_valid_ids(text, message):
    with pytest.raises(ValueError) as error:
        aggregators.get(text)
    assert message in str(error.value)


def test_the_cli_and_the_benchmarks_read_the_same_spelling():
    from benchmarks import harness

    for text in ("arc>median+wm", "nnm>arc>centered_clipping(radius=0.5)+wm0.99"):
        c = spelling.parse(text)
        assert harness.parse_config(text) == (c.rule, c.aggregator, c.worker_momentum)


def test_a_pre_aggregations_inner_rule_reads_a_configuration_string():
    # What a user writes anywhere else: ARC around "nnm>median" is "arc>nnm>median".
    assert aggregators.serialize(aggregators.ARC("nnm>median")) == (
        aggregators.serialize(aggregators.get("arc>nnm>median"))
    )
    with pytest.raises(
        ValueError, match="ends with worker momentum, which the strategy keeps"
    ):
        aggregators.ARC("nnm>median+wm")


def test_commas_separate_arguments_as_semicolons_do():
    assert spelling.parse("bucketing(bucket_size=2,seed=0)>median") == spelling.parse(
        "bucketing(bucket_size=2;seed=0)>median"
    )


def test_spell_takes_what_get_takes():
    assert aggregators.spell("krum") == "krum"
    assert (
        aggregators.spell("nnm>median(num_byzantine=1)")
        == "nnm>median(num_byzantine=1)"
    )


def test_the_benchmarks_list_keeps_commas_inside_arguments():
    from benchmarks import harness

    assert harness.config_names("krum, bucketing(bucket_size=2,seed=0)>median") == [
        "krum",
        "bucketing(bucket_size=2,seed=0)>median",
    ]


# ---------------------------------------------------------------- strategies


def test_strategies_take_configuration_strings(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], aggregator="arc>geometric_median", num_byzantine=1
    )
    assert (
        aggregators.spell(strategy.extended.aggregator)
        == "arc>geometric_median(num_byzantine=1)"
    )
    stages = strategy.extended._reduction.path.stages
    assert [type(s) for s in stages] == [gradients.Transform, gradients.Rule]

    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], aggregator="nnm>trimmed_mean+wm", num_byzantine=1
    )
    assert strategy.extended.worker_momentum == 0.9
    assert isinstance(strategy.extended.aggregator, aggregators.NearestNeighborMixing)

    with pytest.raises(ValueError, match="Set it in one place"):
        kpd.PSStrategy(
            devices=cpu_devices[:4],
            aggregator="median+wm",
            worker_momentum=0.5,
            num_byzantine=1,
        )
    with pytest.raises(ValueError, match="Unknown pre-aggregation 'nmn'"):
        kpd.PSStrategy(devices=cpu_devices[:4], aggregator="nmn>median")


def test_the_state_variables_keep_the_checkpointed_order(cpu_devices):
    """The chain's state flattens as the composed rule's did
    (`WorkerMomentum(UnderAttack(rule))`: the momenta, then the rule's), so
    checkpoints written before the chain restore into it."""
    from keras_psdist.aggregators.momentum import WorkerMomentum
    from keras_psdist.distribute.reduction import GradientReduction

    _, columns = _values()
    rule = aggregators.get("arc>centered_clipping").bind(N, F)
    attack = attacks.SignFlip(replicas=[N - 1])
    reduction = GradientReduction(rule, attack, cpu_devices[0], N, worker_momentum=0.9)
    reduction(SUM, [[v / N for v in c] for c in columns], None)
    old = WorkerMomentum(attacks.UnderAttack(rule, attack), 0.9).bind(N, F)
    want = tf.nest.flatten(old.initial_state(_specs(columns)))
    got = reduction.state.kept
    assert [(v.shape, v.dtype) for v in got] == [(t.shape, t.dtype) for t in want]


def test_a_users_pre_aggregation_with_only_apply_stays_one_stage():
    from keras_psdist.aggregators.pre_aggregation import PreAggregation

    class Halve(PreAggregation):
        def apply(self, per_replica, state=()):
            halved = [[v / 2 for v in column] for column in per_replica]
            return self.inner_rule(len(per_replica[0])).apply(halved, state)

    rule = Halve("median").bind(N, F)
    path = gradients.gradient_path(rule, num_replicas=N)
    assert [type(s) for s in path.stages] == [gradients.Rule]
    arrays, columns = _values()
    out, _ = path.apply(Replicas(columns, MEAN), path.init(_specs(columns)))
    want = reference.median([a / 2 for a in arrays], f=F)
    for got, w in zip(out.values, want, strict=True):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-5)


def test_spelling_spell_is_a_deprecated_alias_of_spell_config():
    config = aggregators.serialize(aggregators.get("nnm>trimmed_mean"))
    with pytest.warns(DeprecationWarning, match="spell_config"):
        assert spelling.spell(config) == spelling.spell_config(config)
