"""The command line starts fast and prints only what has something to say.

- `keras_psdist.cli.main` and the cluster modules load without TensorFlow, so
  `--help` and a bad TF_CONFIG are answered before TensorFlow would load;
- TensorFlow's start-up banner stays out of `demo` and `launch` output unless
  `--verbose`, and no other line is hidden;
- the report callbacks keep Keras's progress bar to its usual line.
"""

import io
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

import keras_psdist as kpd
from keras_psdist.cluster import launcher
from keras_psdist.cluster.launcher import banner
from keras_psdist.sync.protocol import SyncConfig

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `python -m keras_psdist ARGS`, saying at exit whether TensorFlow was imported.
_WRAPPER = """
import atexit, runpy, sys
atexit.register(
    lambda: print("tensorflow imported:", "tensorflow" in sys.modules, file=sys.stderr)
)
sys.argv = ["keras-psdist", *sys.argv[1:]]
runpy.run_module("keras_psdist", run_name="__main__", alter_sys=True)
"""

# Lines TensorFlow 2.21 prints on start-up on a machine without a GPU.
BANNER = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR",
    "I0000 00:00:1795559549.149687   27148 port.cc:153] oneDNN custom operations "
    "are on. You may see slightly different numerical results due to "
    "floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795559549.150059   27148 cudart_stub.cc:31] Could not find cuda "
    "drivers on your machine, GPU will not be used.",
    "I0000 00:00:1795559549.195751   27148 cpu_feature_guard.cc:227] This "
    "TensorFlow binary is optimized to use available CPU instructions in "
    "performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 "
    "AVX_VNNI FMA, in other operations, rebuild TensorFlow with the appropriate "
    "compiler flags.",
    "E0000 00:00:1795559560.363186   27238 cuda_platform.cc:52] failed call to "
    "cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "W0000 00:00:1795559560.363186   27238 dataset.cc:1432] Input of "
    "GeneratorDatasetOp::Dataset will not be optimized because the dataset does "
    "not implement the AsGraphDefInternal() method needed to apply optimizations.",
]

# Lines like the banner's that say something: they must be shown.
NOT_BANNER = [
    "E0000 00:00:1795559560.363186   27238 cuda_platform.cc:52] failed call to "
    "cuInit: INTERNAL: CUDA error: Failed call to cuInit: "
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has unsupported display driver",
    "F0000 00:00:1795559560.363186   27238 port.cc:153] Check failed: oneDNN",
    "E0000 00:00:1795559560.363186   27238 grpc_server_lib.cc:1] No address added "
    "out of total 1 resolved for '0.0.0.0:2222'",
    "RuntimeError: WARNING: All log messages before absl::InitializeLog() is "
    "called are written to STDERR",
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR, and more",
    "Traceback (most recent call last):",
]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # The command's own default, not the test suite's, is under test.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p
    )
    env.update(extra)
    return env


def _run(args: list[str], timeout: float = 60, **env: str):
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=_env(**env),
    )


def _cli_without_tf(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Runs the CLI; fails the test if it imported TensorFlow."""
    result = _run([sys.executable, "-c", _WRAPPER, *args], **env)
    assert "tensorflow imported: False" in result.stderr, result.stderr
    return result


def _banner_lines(text: str) -> list[str]:
    """The banner's lines in `text`, launcher prefixes (`[ps:0] `) removed."""
    lines = [
        line.split("] ", 1)[-1] if line.startswith("[") else line
        for line in text.splitlines()
    ]
    return [line for line in lines if banner.is_tf_banner(line)]


# ------------------------------------------------------------ no TensorFlow


def test_the_cli_and_cluster_modules_import_without_tensorflow():
    code = (
        "import sys, keras_psdist, keras_psdist.cli.main, keras_psdist.cluster, "
        "keras_psdist.cluster.config, keras_psdist.cluster.launcher, "
        "keras_psdist.cluster.server\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras'))\n"
        "assert not loaded, loaded[:5]"
    )
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr


def test_help_lists_every_aggregator_and_attack_without_tensorflow():
    result = _cli_without_tf("demo", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: keras-psdist demo" in result.stdout
    for name in (*kpd.aggregators.names(), *kpd.attacks.names()):
        assert name in result.stdout, name
    assert "--verbose" in result.stdout


def test_serve_rejects_a_bad_tf_config_before_tensorflow_loads():
    result = _cli_without_tf("serve", TF_CONFIG="{oops")
    assert result.returncode == 2, result.stderr
    assert "keras-psdist: error: TF_CONFIG is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--aggregator=krumm", "Unknown aggregator 'krumm'. Expected one of: mean,"),
        (
            "--aggregator=nmn>median",
            "Unknown pre-aggregation 'nmn' in 'nmn>median'. Expected one of: nnm,",
        ),
        ("--aggregator=median>nnm", "The rule goes last in 'median>nnm'"),
        ("--attack=sign_flap", "Unknown attack 'sign_flap'. Expected one of: sign_"),
    ],
)
def test_demo_rejects_an_unknown_id_before_tensorflow_loads(flag, expected):
    result = _cli_without_tf("demo", flag, "--num_byzantine=1")
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr


# ------------------------------------------------------------ banner


@pytest.mark.parametrize("line", BANNER)
def test_banner_lines_are_recognised(line):
    assert banner.is_tf_banner(line)


@pytest.mark.parametrize("line", NOT_BANNER)
def test_other_lines_are_not(line):
    assert not banner.is_tf_banner(line)


@pytest.mark.parametrize("verbose", [False, True])
def test_launch_output_leaves_out_the_banner_unless_verbose(verbose):
    out = io.StringIO()
    output = launcher.processes.Output(
        out, hide=None if verbose else banner.is_tf_banner
    )
    seen = []
    child = io.BytesIO("".join(f"{x}\n" for x in [*BANNER, *NOT_BANNER]).encode())
    output.copy("ps:0", child, seen.append)
    # The launcher still reads every line (e.g. for the server's ready line).
    assert seen == [*BANNER, *NOT_BANNER]
    shown = [*BANNER, *NOT_BANNER] if verbose else NOT_BANNER
    assert out.getvalue() == "".join(f"[ps:0] {x}\n" for x in shown)


# `demo`'s output with and without --verbose is checked on the demo runs
# test_cli makes anyway (test_demo_trains_to_high_accuracy_and_prints_no_
# tensorflow_banner, test_demo_robust_rule_under_attack_reports_per_replica).


# A trivial TensorFlow program, and a line like the banner's that is not.
_TF_SCRIPT = (
    "import sys, tensorflow as tf\n"
    "print('sum', int(tf.reduce_sum(tf.range(4))))\n"
    f"print({NOT_BANNER[0]!r}, file=sys.stderr)\n"
)


@pytest.mark.multiprocess
@pytest.mark.parametrize("verbose", [False, True])
def test_launch_output_has_the_banner_only_when_verbose(verbose):
    args = ["launch", "--mode=between-graph", "--num_ps=1", "--num_workers=1"]
    result = _run(
        [sys.executable, "-m", "keras_psdist", *args]
        + (["--verbose"] if verbose else [])
        + ["--", sys.executable, "-c", _TF_SCRIPT],
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[worker:0] sum 6" in output
    assert f"[worker:0] {NOT_BANNER[0]}" in output
    banner = _banner_lines(output)
    assert bool(banner) == verbose, output


# ------------------------------------------------------------ callbacks


def test_aggregation_report_keeps_the_progress_bar_short(cpu_devices, capsys):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], aggregator="median", num_byzantine=1
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    report = kpd.callbacks.AggregationReport()
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    history = model.fit(
        x, x[:, :2], batch_size=32, epochs=2, verbose=2, callbacks=[report]
    )
    out = capsys.readouterr().out
    assert "replica_" not in out, out
    summaries = [line for line in out.splitlines() if line.startswith("Median, ")]
    assert len(summaries) == 2, out
    words = kpd.callbacks.describe_report("extreme_fraction")
    assert summaries[0].startswith(f"Median, this epoch, per replica: {words}: ")
    # The figures are all kept: on the callback and in the History.
    assert len(report.history["extreme_fraction"]) == 2
    for r in range(4):
        assert history.history[f"extreme_fraction/replica_{r}"] == [
            float(epoch[r]) for epoch in report.history["extreme_fraction"]
        ]
    # verbose=0: nothing printed.
    model.fit(x, x[:, :2], batch_size=32, epochs=1, verbose=0, callbacks=[report])
    assert capsys.readouterr().out == ""


class _FakeSyncTraining:
    # Workers named by task, as in a cluster with a chief job.
    sync = types.SimpleNamespace(
        config=SyncConfig(2, 2, 1.0, worker_names=("chief:0", "worker:0"))
    )

    def counts(self) -> dict:
        return {
            "global_step": 7,
            "applied": np.array([7, 5]),
            "dropped_stale": np.array([0, 2]),
            "dropped_at_end": np.array([0, 0]),
        }


def _sync_report(training):
    extended = types.SimpleNamespace(
        sync_training=training, services=types.SimpleNamespace(training=training)
    )
    model = types.SimpleNamespace(
        distribute_strategy=types.SimpleNamespace(extended=extended),
        history=keras.callbacks.History(),
    )
    report = kpd.callbacks.SyncReplicaReport()
    report.set_model(model)
    report.set_params({"verbose": 1, "epochs": 1, "steps": 1})
    return report


class _WorkerTrainingOnAlone(_FakeSyncTraining):
    def counts(self) -> dict:
        return {**super().counts(), "dropped_at_end": np.array([0, 41])}


def test_sync_replica_report_says_what_dropped_at_the_end_means(capsys):
    """A worker that trains on after the others finished: its gradients
    are dropped, and the line says why."""
    report = _sync_report(_WorkerTrainingOnAlone())
    report.on_train_begin()
    report.on_epoch_end(0, {})
    report.on_epoch_begin(1)
    first = capsys.readouterr().out
    assert first.endswith(
        "dropped at the end 41 (most from worker:0: 41; sent after the last "
        "update, when the chief's fit had ended or too few workers were still "
        "training to make another: not applied)\n"
    )
    # Said once a fit: the next epochs' lines give the counts.
    report.on_epoch_end(1, {})
    report.on_train_end()
    assert capsys.readouterr().out == (
        "sync: 7 updates; gradients applied 12, dropped as stale 2 (most from "
        "worker:0: 2), dropped at the end 41 (most from worker:0: 41)\n"
    )


def test_sync_replica_report_keeps_the_epoch_logs_short(capsys):
    report = _sync_report(_FakeSyncTraining())
    model = report.model
    report.on_train_begin()
    report.on_epoch_begin(0)
    logs = {"loss": 0.5}
    report.on_epoch_end(0, logs)
    assert logs == {"loss": 0.5}
    assert capsys.readouterr().out == ""  # Not inside the progress bar's line.
    report.on_train_end()
    # Each drop says what it is; a count of 0 needs no words.
    assert capsys.readouterr().out == (
        "sync: 7 updates; gradients applied 12, dropped as stale 2 (most from "
        "worker:0: 2; arrived after the update of their step: a backup worker's "
        "late gradients, not applied), dropped at the end 0\n"
    )
    assert model.history.history["sync/global_step"] == [7.0]
    # Keys by task name: index 1 is worker:0 when the cluster has a chief.
    assert model.history.history["sync/dropped_stale/worker_0"] == [2.0]
    assert model.history.history["sync/dropped_stale/chief_0"] == [0.0]
    assert report.counts["applied"].tolist() == [7, 5]
