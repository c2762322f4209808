"""The supported TensorFlow / Keras / Python pairs, one nox session each.

keras_psdist builds on TensorFlow's private distribute modules and wraps a
few Keras internals (`keras_psdist/_tf.py`, `keras_psdist/integration/keras_patches.py`),
so each pair it claims to support is tested here, in its own virtualenv:

    nox -l                        # the sessions
    nox -s "suite(tf='2.19')"     # the whole default suite on one pair
    nox -s oldest                 # what `.ci/run` adds: the Keras contract
                                  # tests and one cluster launch, oldest pair
    nox -s slow                   # the tests marked slow, which CI leaves
                                  # out (the whole robustness and combination
                                  # matrices), on the installed pair

The range itself is declared in `setup.cfg` (and checked on import by
`keras_psdist._tf`); `tests/test_versions.py` keeps this file, the metadata
and the import-time gate saying the same thing.
"""

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

# (python, tensorflow, keras): each TensorFlow minor with a Keras 3 release
# of its time. The first is the oldest pair, the last the newest.
PAIRS = [
    ("3.11", "2.19", "3.10"),
    ("3.12", "2.20", "3.11"),
    ("3.11", "2.21", "3.15"),
    ("3.13", "2.21", "3.15"),
]
OLDEST = PAIRS[0]

# What the oldest pair runs in CI: every Keras contract (MirroredStrategy and
# the default strategy in the same process as ours), the integration layer's
# own tests, and one whole in-graph cluster launch (ps + worker processes).
OLDEST_TESTS = [
    "tests/test_keras_contract.py",
    "tests/test_keras_integration.py",
    "tests/test_cluster_training.py",
    "-k",
    "contract or integration or in_graph",
]


def _install(session, tf, keras):
    session.install(
        "-e",
        ".[test]",
        f"tensorflow-cpu=={tf}.*",
        f"tensorboard=={tf}.*",
        f"keras=={keras}.*",
    )
    session.run(
        "python",
        "-c",
        "import tensorflow as tf, keras; "
        "print('tensorflow', tf.__version__, 'keras', keras.__version__)",
    )


@nox.session
@nox.parametrize(
    "python,tf,keras",
    [nox.param(*pair, id=f"tf='{pair[1]}', python='{pair[0]}'") for pair in PAIRS],
)
def suite(session, tf, keras):
    """The default test suite (as `.ci/run`) on one supported pair."""
    _install(session, tf, keras)
    session.run("python", "-m", "pytest", "-n", "3", "-m", "not slow", "-q")


@nox.session(python=OLDEST[0])
def oldest(session):
    """The Keras contract tests and one cluster launch on the oldest pair."""
    _, tf, keras = OLDEST
    _install(session, tf, keras)
    session.run(
        "python", "-m", "pytest", "-n", "2", "-m", "not slow", "-q", *OLDEST_TESTS
    )


@nox.session(python=False)
def slow(session):
    """The tests marked `slow` (the default suite and CI leave them out): the
    whole robustness matrix of every rule and attack, the combination matrix
    of every compressor and rule with and without an attack, MirroredStrategy
    beside ours; in the current environment."""
    session.run("python", "-m", "pytest", "-n", "2", "-m", "slow", "-q")
