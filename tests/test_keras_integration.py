"""The one list of Keras methods keras_psdist wraps: installed together,
reversible, and invisible to models of other strategies (or none)."""

import keras
import numpy as np
import pytest

import keras_psdist as kpd
from keras_psdist.integration import keras_patches


@pytest.fixture
def installed():
    """Patches installed (as after building any strategy); reinstalled after
    a test that uninstalls them, for the tests that follow in this process."""
    kpd.PSStrategy(devices=["/cpu:0"])
    assert keras_patches.is_installed()
    try:
        yield
    finally:
        keras_patches.install()


def _current(patch):
    owner, name = patch.resolve()
    return getattr(owner, name)


def test_every_patch_names_a_keras_attribute_and_why():
    for patch in keras_patches.PATCHES:
        owner, name = patch.resolve()
        assert hasattr(owner, name), patch.target
        assert patch.why, patch.target
    targets = [p.target for p in keras_patches.PATCHES]
    # fit is wrapped three times: lost-task reporting inside, the sync
    # session around it, and the scope check outermost (before the session).
    fit = "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.fit"
    assert targets.count(fit) == 3
    wrappers = [p.wrapper for p in keras_patches.PATCHES if p.target == fit]
    assert wrappers == [
        "keras_psdist.cluster.task_loss:reporting",
        "keras_psdist.integration.training_hooks:sync_fit",
        "keras_psdist.integration.compile_checks:checked_in_scope",
    ]


def test_uninstall_restores_keras_and_install_applies_once(installed):
    targets = [p.target for p in keras_patches.PATCHES]
    patched = {p.target: _current(p) for p in keras_patches.PATCHES}
    # Keras's own: each wrapper wraps the one before it (`functools.wraps`).
    originals = {}
    for target, current in patched.items():
        for _ in range(targets.count(target)):
            current = current.__wrapped__
        originals[target] = current
    keras_patches.uninstall()
    assert not keras_patches.is_installed()
    for patch in keras_patches.PATCHES:
        assert _current(patch) is originals[patch.target], patch.target
    keras_patches.install()
    keras_patches.install()  # Once: a second call changes nothing.
    for patch in keras_patches.PATCHES:
        current = _current(patch)
        assert current is not originals[patch.target], patch.target
        for _ in range(targets.count(patch.target)):
            current = current.__wrapped__
        assert current is originals[patch.target], patch.target


def _train_plain(tmp_path, tag):
    """A model of no strategy: fit with checkpoints, evaluate, predict, save."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((64, 8), np.float32)
    y = rng.integers(0, 3, 64)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Embedding(10, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    ids = (x * 10).astype(np.int32)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    history = model.fit(
        ids,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(str(tmp_path / f"{tag}.keras")),
            keras.callbacks.BackupAndRestore(str(tmp_path / f"{tag}-backup")),
        ],
    )
    model.save(tmp_path / f"{tag}-final.keras")
    return (
        [np.asarray(w) for w in model.get_weights()],
        history.history["loss"],
        model.predict(ids, verbose=0),
        sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(tag)),
    )


def test_models_of_no_strategy_train_exactly_as_without_the_library(
    installed, tmp_path
):
    with_patches = _train_plain(tmp_path, "with")
    keras_patches.uninstall()
    without = _train_plain(tmp_path, "without")
    for a, b in zip(with_patches[0], without[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert with_patches[1] == without[1]
    np.testing.assert_array_equal(with_patches[2], without[2])
    assert [n.replace("with", "") for n in with_patches[3]] == [
        n.replace("without", "") for n in without[3]
    ]


def test_keras_and_tensorflow_internals_are_reached_from_one_layer():
    """`keras.src` only in `integration/keras_patches.py`, `tensorflow.python`
    only in `_tf.py`: a Keras or TensorFlow release that moves a private name
    breaks one known file."""
    import pathlib
    import re

    package = pathlib.Path(kpd.__file__).parent
    allowed = {
        "keras.src": "integration/keras_patches.py",
        "tensorflow.python": "_tf.py",
    }
    found = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        for internal, home in allowed.items():
            relative = path.relative_to(package).as_posix()
            if relative != home and re.search(rf"\b{re.escape(internal)}\b", text):
                found.append(f"{path.relative_to(package)}: {internal}")
    assert not found, found


def test_architecture_page_lists_every_patch_with_its_reasons():
    import pathlib

    page = (
        pathlib.Path(__file__).parent.parent / "docs" / "architecture.md"
    ).read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `keras")]
    expected = [
        f"| `{p.target}` (`{p.wrapper.split(':')[1]}`) | {p.why} | "
        f"{p.no_extension_point} |"
        for p in keras_patches.PATCHES
    ]
    assert rows == expected
