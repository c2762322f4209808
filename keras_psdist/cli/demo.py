"""End-to-end demo: a small MLP on scikit-learn's bundled digits dataset.

Run it with `keras-psdist demo`; the CLI splits the host CPU into logical
devices before TensorFlow starts, so several replicas train on one machine.
"""

import numpy as np
from absl import logging as absl_logging

_SPLIT_SEED = 0

# What the demo's attacks send besides the replicas they control: strong
# enough to wreck the mean (as in benchmarks/robustness.py: with 1 of 4
# replicas sending -10 g, the mean is (3 - 10) / 4 g, an ascent step). ALIE,
# IPM (optimal or not) and mimic keep their own settings, which are aimed at
# the robust rules.
ATTACK_SETTINGS: dict[str, dict[str, float | int]] = {
    "sign_flip": {"scale": 10.0},
    "scale": {"factor": 100.0},
    "gaussian_noise": {"stddev": 10.0},
    "non_finite": {},
    "alie": {},
    "ipm": {},
    "optimal_alie": {},
    "optimal_ipm": {},
    "mimic": {},
    "min_max": {},
    "min_sum": {},
    "rop": {},
    "optimal_label_flip": {"num_classes": 10},
    "label_flip": {"num_classes": 10},
}


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Loads the bundled digits dataset and splits it 80/20.

    Returns:
        `(x_train, y_train, x_test, y_test)`: features are float32 scaled to
        [0, 1] with shape `(n, 64)`; labels are int32 in `[0, 10)`. The split
        is stratified and uses a fixed seed, so it is identical across runs.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=_SPLIT_SEED, stratify=y
    )
    return x_train, y_train, x_test, y_test


def _replica_devices(strategy) -> str:
    try:
        return ", ".join(strategy.extended.worker_devices)
    except (AttributeError, NotImplementedError):
        return "n/a"


def run_demo(
    replicas: int,
    epochs: int,
    batch_size: int,
    aggregator: str,
    seed: int,
    num_byzantine: int = 0,
    attack: str | None = None,
    compression: str | None = None,
) -> float:
    """Trains and evaluates a digits classifier under `PSStrategy`.

    Device setup (splitting the CPU into logical devices) is the caller's job
    and must happen before TensorFlow initializes; `keras-psdist demo` does it.

    Args:
        replicas: The number of replicas the caller configured. Only reported;
            the strategy uses every visible device.
        epochs: Number of training epochs.
        batch_size: Global batch size (any size; an uneven split over the
            replicas is weighted exactly).
        aggregator: The gradient aggregation rule or configuration, e.g.
            `"mean"`, `"nnm>trimmed_mean+wm"` (`keras_psdist.spelling`).
        seed: Random seed for weight initialization and shuffling.
        num_byzantine: Replicas that may be faulty (the rule's f), and with
            `attack` the replicas that attack. With `"mean"`, which guards
            against none, the strategy gets 0 and an attack goes through: the
            undefended baseline.
        attack: A `keras_psdist.attacks` id (e.g. `"sign_flip"`) run by the
            last `num_byzantine` replicas with the settings in
            `ATTACK_SETTINGS`, or `None`. `label_flip` flips the 10 digit
            classes.
        compression: What each replica sends instead of its gradient
            (`keras_psdist.compression`, e.g. `"top_k(ratio=0.01)"`), or
            `None`.

    Returns:
        The test-set accuracy, a float in [0, 1].

    Raises:
        ValueError: If the strategy rejects the configuration (unknown
            aggregator, batch size not divisible by the replica count, ...).
    """
    import keras

    import keras_psdist
    from keras_psdist import spelling

    keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = load_digits_split()

    attack_config = None
    if attack:
        n = len(keras_psdist.PSStrategy().extended.worker_devices)
        config = {
            "replicas": list(range(max(n - num_byzantine, 0), n)),
            **ATTACK_SETTINGS.get(attack, {}),
        }
        if attack == "gaussian_noise":
            config["seed"] = seed
        attack_config = {"class_name": attack, "config": config}
    undefended = (
        spelling.parse(aggregator).stages == ("mean",) and attack_config is not None
    )
    verbosity = absl_logging.get_verbosity()
    if undefended:  # The `baseline:` line below says it, for this run.
        absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        strategy = keras_psdist.PSStrategy(
            aggregator=aggregator,
            num_byzantine=0 if undefended else num_byzantine,
            attack=attack_config,
            compression=compression,
        )
    finally:
        absl_logging.set_verbosity(verbosity)
    n = strategy.num_replicas_in_sync
    requested = "" if n == replicas else f" (requested {replicas})"
    print(f"replicas:   {n}{requested}")
    print(f"devices:    {_replica_devices(strategy)}")
    print(
        "aggregator: "
        + (
            "mean, undefended (it guards against no replica)"
            if undefended
            else keras_psdist.aggregators.spell(strategy.extended.aggregator)
            + (
                f"+wm{strategy.extended.worker_momentum}"
                if strategy.extended.worker_momentum
                else ""
            )
            + f" ({strategy.extended.aggregator!r})"
        )
    )
    if strategy.extended.compression is not None:
        print(f"compression: {strategy.extended.compression!r}")
    if strategy.extended.attack is not None:
        print(f"attack:     {strategy.extended.attack!r}")
    if undefended:
        attackers = ", ".join(map(str, strategy.extended.attack.replicas))
        print(
            f"baseline:   --num-byzantine {num_byzantine}: replica{'s' if num_byzantine > 1 else ''} "
            f"{attackers} attack{'' if num_byzantine > 1 else 's'} and the mean lets it "
            "through; try --aggregator median"
        )
    print(f"train/test: {len(x_train)}/{len(x_test)} samples, batch {batch_size}")

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(64,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            # With worker momentum the replicas' gradients are momenta
            # already: Adam's own first moment is then turned off (beta_1=0),
            # as the strategy's warning about the two together advises.
            optimizer=keras.optimizers.Adam(
                learning_rate=3e-3,
                beta_1=0.0 if strategy.extended.worker_momentum else 0.9,
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    report = keras_psdist.callbacks.AggregationReport()
    model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.1,
        verbose="auto",
        callbacks=[report],
    )
    for name, per_epoch in report.history.items():
        values = " ".join(f"{v:.0%}" for v in per_epoch[-1])
        words = keras_psdist.callbacks.describe_report(name)
        print(f"last epoch, per replica (0 to {n - 1}): {words}: {values}")

    print()
    print(strategy.extended.placement)
    results = model.evaluate(
        x_test, y_test, batch_size=batch_size, verbose=0, return_dict=True
    )
    accuracy = float(results["accuracy"])
    print(f"test accuracy: {accuracy:.3f}")
    return accuracy
