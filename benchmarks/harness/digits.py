"""`robustness.py`'s training runs: the digits MLP under a simulated attack.

Shared with `robustness.py --noise` (`harness/robustness_noise.py`), which trains the same runs again with
other seeds. One run (`Run`) is one (configuration, attack) pair: data
(`load_data`: scikit-learn's digits, 80 % train, 20 % held out), input
(`make_input`: IID, or a Dirichlet split over the replicas), the MLP
(`build_model`), the attack (`ATTACKS`) and `train_one`, which trains it on
`PSStrategy` over logical CPU replicas and scores it on the held-out part.
`Setup` holds what a run depends on besides its pair, at
`robustness.py`'s defaults.

Imports TensorFlow (after `prepare_tensorflow`).
"""

from __future__ import annotations

import argparse
import ast
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from .checkout import ensure_importable, prepare_tensorflow
from .configs import compression_of, parse_config

# Before TensorFlow is imported anywhere in this process.
prepare_tensorflow()
ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_psdist as kpd  # noqa: E402

A = kpd.attacks

NUM_CLASSES = 10


@dataclass(frozen=True)
class AttackSpec:
    """One column of the table: a label and how to build the attack."""

    label: str
    build: Callable[[list[int], int], object | None]  # (replicas, seed) -> attack


# Strengths: the scaled sign flip sends -10 g from 2 of 8 replicas, so the
# mean is (6 - 20) / 8 g = -1.75 g, an ascent step; IPM with epsilon=100 is
# (6 - 200) / 8 = -24 x the honest mean; both wreck the mean. IPM with
# epsilon=0.1 leaves the mean a 0.725 g descent step: it is aimed at the
# robust rules, not at the mean. The noise's stddev is ~1000x a gradient
# coordinate's typical size (rms 0.008 to 0.017), so it swamps the mean's
# signal.
ATTACKS: dict[str, AttackSpec] = {
    "none": AttackSpec("none", lambda r, s: None),
    "sign_flip": AttackSpec(
        "sign flip x10", lambda r, s: A.SignFlip(replicas=r, scale=10.0)
    ),
    "scale": AttackSpec("scale x100", lambda r, s: A.Scale(replicas=r, factor=100.0)),
    "gaussian": AttackSpec(
        "noise sd=10", lambda r, s: A.GaussianNoise(replicas=r, stddev=10.0, seed=s)
    ),
    "alie": AttackSpec("ALIE", lambda r, s: A.ALIE(replicas=r)),
    "ipm_small": AttackSpec("IPM e=0.1", lambda r, s: A.IPM(replicas=r, epsilon=0.1)),
    "ipm_large": AttackSpec("IPM e=100", lambda r, s: A.IPM(replicas=r, epsilon=100.0)),
    "nan": AttackSpec("NaN", lambda r, s: A.NonFinite(replicas=r, value="nan")),
    "label_flip": AttackSpec(
        "label flip", lambda r, s: A.LabelFlip(replicas=r, num_classes=NUM_CLASSES)
    ),
    # Adaptive: the factor that does the most damage against the rule in use,
    # searched every step (ByzFL's optimal attacks); and copying one honest
    # replica, which under non-IID data over-weights its part.
    "optimal_alie": AttackSpec("opt. ALIE", lambda r, s: A.OptimalALIE(replicas=r)),
    "optimal_ipm": AttackSpec("opt. IPM", lambda r, s: A.OptimalIPM(replicas=r)),
    "mimic": AttackSpec("mimic", lambda r, s: A.Mimic(replicas=r)),
    # The farthest forgery that still looks honest (Shejwalkar and
    # Houmansadr, NDSS 2021), each with its authors' default perturbation.
    "min_max": AttackSpec("Min-Max", lambda r, s: A.MinMax(replicas=r)),
    "min_sum": AttackSpec("Min-Sum", lambda r, s: A.MinSum(replicas=r)),
    # Sideways from the rule's last aggregate, where centered clipping
    # trusts (Ozfatura et al., TIFS 2024), the authors' defaults.
    "rop": AttackSpec("ROP", lambda r, s: A.ROP(replicas=r)),
    # The label flip, scaled each step as far as the rule lets it through.
    "optimal_label_flip": AttackSpec(
        "opt. label flip",
        lambda r, s: A.OptimalLabelFlip(replicas=r, num_classes=NUM_CLASSES),
    ),
}


_SPELLED = re.compile(r"([A-Za-z_]\w*)\((.*)\)")


def attack_named(spelling: str) -> str:
    """The `ATTACKS` key of `spelling`: a key already, or a registered
    attack id with arguments, ``rop(z=0.3)`` or ``alie(z=1;...)`` (as the
    rules' stages are spelled), added to `ATTACKS` under that spelling.

    >>> attack_named("rop(z=0.3)"), ATTACKS["rop(z=0.3)"].label
    ('rop(z=0.3)', 'ROP z=0.3')
    """
    spelling = spelling.strip()
    if spelling in ATTACKS:
        return spelling
    match = _SPELLED.fullmatch(spelling)
    if not match or match.group(1) not in kpd.attacks.names():
        raise ValueError(
            f"unknown attack {spelling!r}: one of {','.join(ATTACKS)}, or a "
            f"registered attack with arguments like rop(z=0.3) (ids: "
            f"{','.join(kpd.attacks.names())})"
        )
    name, arguments = match.group(1), {}
    for item in filter(str.strip, match.group(2).split(";")):
        key, _, value = item.partition("=")
        try:
            arguments[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            arguments[key.strip()] = value.strip()
    label = ATTACKS[name].label if name in ATTACKS else name
    label += " " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in arguments.items())  # fmt: skip
    ATTACKS[spelling] = AttackSpec(
        label.strip(),
        lambda r, s: kpd.attacks.get(
            {"class_name": name, "config": {"replicas": r, **arguments}}
        ),
    )
    return spelling


def attack_list(text: str) -> list[str]:
    """argparse type: comma-separated attacks, each a key of `ATTACKS` or a
    spelling `attack_named` reads (a comma inside parentheses stays)."""
    parts = re.split(r",(?![^()]*\))", text)
    try:
        names = [attack_named(part) for part in parts if part.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not names:
        raise argparse.ArgumentTypeError(f"no attack in {text!r}")
    return list(dict.fromkeys(names))


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits, scaled to [0, 1], shuffled with `seed`: 80 % train, 20 % held out."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def make_dataset(x, y, batch: int, seed: int) -> tf.data.Dataset:
    """Endless, reshuffled each pass with a fixed seed, full batches only."""
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def make_input(x, y, args) -> tuple[tf.data.Dataset, int]:
    """The run's dataset and steps per epoch: IID (every replica draws from
    all of `x`), or `--data dirichlet:ALPHA` (replica r trains on its part of
    a Dirichlet(ALPHA) label split, `keras_psdist.heterogeneity`), or, when
    `args.parts` is set, replica r on the indices `args.parts[r]`;
    `args.steps` (when set) steps an epoch instead of ``len(x) // batch``."""
    steps = getattr(args, "steps", None) or len(x) // args.batch
    parts = getattr(args, "parts", None)
    if args.alpha is None and parts is None:
        return make_dataset(x, y, args.batch, args.seed), steps
    if parts is None:
        parts = kpd.heterogeneity.dirichlet_split(
            y, args.replicas, args.alpha, args.seed
        )
    dataset = kpd.heterogeneity.per_replica_dataset(
        x, y, parts, args.batch // args.replicas, seed=args.seed
    ).repeat()
    return dataset.prefetch(tf.data.AUTOTUNE), steps


def build_model(
    hidden: int, lr: float, momentum: float, worker_momentum: float = 0.0
) -> keras.Model:
    """The MLP. With worker momentum beta, its SGD drops its own momentum and
    takes `lr / (1 - beta)`: for `mean` the very same steps as SGD(lr, beta)."""
    if worker_momentum:
        lr, momentum = lr / (1 - worker_momentum), 0.0
    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=lr, momentum=momentum),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@dataclass
class Run:
    """One cell of the table."""

    rule: str
    attack: str
    num_byzantine: int | None = None
    status: str = "pending"  # ok | n/a | failed
    reason: str | None = None
    accuracy: float | None = None
    final_loss: float | None = None
    finite_weights: bool | None = None
    time_s: float | None = None
    report: dict[str, list[list[float]]] = field(default_factory=dict)
    traceback: str | None = None
    # Accuracy on further held-out sets, by name (`train_one`'s `evaluate`).
    scores: dict[str, float] = field(default_factory=dict)


@dataclass
class Setup:
    """What a run depends on besides its configuration and attack:
    `robustness.py`'s flags of the same names, at their defaults.

    `devices` are the replicas' devices (`split_host_cpu(replicas)`), `alpha`
    the Dirichlet concentration of a non-IID split (None: IID data), `input`
    ``"dataset"`` (a repeated tf.data pipeline) or ``"arrays"``
    (``fit(x, y)``).
    """

    replicas: int = 8
    attackers: list[int] = field(default_factory=lambda: [6, 7])
    num_byzantine: int = 2
    batch: int = 128
    hidden: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    epochs: int = 20
    seed: int = 0
    input: str = "dataset"
    alpha: float | None = None
    devices: list[str] | None = None
    read_dtype: str | None = None
    read_compression: str | None = None
    # Explicit parts (replica r trains on x[parts[r]]) and steps an epoch:
    # robustness_protocol.py's runs on the honest replicas' parts alone.
    parts: list[np.ndarray] | None = None
    steps: int | None = None


def reads_cross_devices() -> None:
    """Makes every replica's read of a variable on another device count as
    one from another task, so `read_dtype` and `read_compression` act on one
    host as on a cluster (op for op the same path; as the tests'
    `across_tasks` fixture)."""
    from keras_psdist.variables import narrow_reads

    narrow_reads.crosses_tasks = lambda variable_device, reading_device: (
        bool(reading_device)
        and tf.DeviceSpec.from_string(variable_device)
        != tf.DeviceSpec.from_string(reading_device)
    )


def rule_f(config: str, args) -> int:
    """The run's num_byzantine: 0 for the undefended mean, else --num-byzantine."""
    return (
        0
        if parse_config(config, allow_compression=True)[0] == "mean"
        else args.num_byzantine
    )


def condition_error(config: str, n: int, f: int) -> str | None:
    """The rule's `bind` error for (n, f), or None when it can run."""
    try:
        kpd.aggregators.get(parse_config(config, allow_compression=True)[1]).bind(n, f)
    except ValueError as e:
        return str(e)
    return None


def train_one(
    run: Run,
    data,
    eval_model: keras.Model,
    args,
    evaluate: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    callbacks: tuple[keras.callbacks.Callback, ...] = (),
) -> None:
    """Trains one (rule, attack) model and fills `run`; never raises.

    `args` is a `Setup`, or `robustness.py`'s flags (which have its fields).
    `evaluate` names further held-out sets `(x, y)` whose accuracy goes to
    `run.scores`; `callbacks` are given to `fit` beside the report.
    """
    xt, yt, xv, yv = data
    f = rule_f(run.rule, args)
    run.num_byzantine = f
    reason = condition_error(run.rule, args.replicas, f)
    if reason is not None:
        run.status, run.reason = "n/a", reason
        return
    start = time.perf_counter()
    try:
        attack = ATTACKS[run.attack].build(list(args.attackers), args.seed)
        _, aggregator, worker_momentum = parse_config(run.rule, allow_compression=True)
        strategy = kpd.PSStrategy(
            devices=args.devices,
            aggregator=aggregator,
            num_byzantine=f,
            attack=attack,
            worker_momentum=worker_momentum,
            compression=compression_of(run.rule),
            read_dtype=getattr(args, "read_dtype", None),
            read_compression=getattr(args, "read_compression", None),
        )
        keras.utils.set_random_seed(args.seed)
        with strategy.scope():
            model = build_model(args.hidden, args.lr, args.momentum, worker_momentum)
        report = kpd.callbacks.AggregationReport()
        if args.input == "arrays":
            history = model.fit(
                xt,
                yt,
                batch_size=args.batch,
                epochs=args.epochs,
                verbose=0,
                callbacks=[report, *callbacks],
            )
        else:
            dataset, steps = make_input(xt, yt, args)
            history = model.fit(
                dataset,
                epochs=args.epochs,
                steps_per_epoch=steps,
                verbose=0,
                shuffle=False,  # the dataset shuffles itself, with a seed
                callbacks=[report, *callbacks],
            )
        weights = model.get_weights()
    except Exception as e:  # noqa: BLE001 - report and go on
        run.status = "failed"
        run.reason = f"{type(e).__name__}: {e}".splitlines()[0]
        run.traceback = traceback.format_exc()
        run.time_s = time.perf_counter() - start
        return
    run.time_s = time.perf_counter() - start
    run.finite_weights = all(np.isfinite(w).all() for w in weights)
    eval_model.set_weights(weights)
    logits = eval_model(xv, training=False).numpy()
    # NaN logits argmax to class 0: a diverged model scores ~10 %.
    run.accuracy = float(np.mean(np.argmax(logits, axis=-1) == yv))
    for name, (x, y) in (evaluate or {}).items():
        predicted = np.argmax(eval_model(x, training=False).numpy(), axis=-1)
        run.scores[name] = float(np.mean(predicted == y))
    run.final_loss = float(history.history["loss"][-1])
    run.report = {k: [v.tolist() for v in vs] for k, vs in report.history.items()}
    run.status = "ok"
