"""Tests for the `keras-psdist` command line (run as subprocesses)."""

import os
import re
import subprocess
import sys

import pytest
import zygote  # tests/cluster_jobs, see conftest.py

import keras_psdist as kpd
from keras_psdist.cli import main as cli
from keras_psdist.cluster.launcher import banner

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_cli(
    *args: str, timeout: float = 120, own_log_level: bool = False
) -> subprocess.CompletedProcess:
    """`python -m keras_psdist ARGS`; with `own_log_level`, TensorFlow's log
    level is the command's own default, not the test suite's, in a fresh
    interpreter (what it prints while importing TensorFlow is checked);
    else a fork of the test zygote (`cluster_jobs/zygote.py`)."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if own_log_level:
        env.pop("TF_CPP_MIN_LOG_LEVEL")
    # The subprocess must find the checkout even without `pip install -e`.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p
    )
    python = [sys.executable]
    if not own_log_level and args and args[0] == "demo":
        env, python = zygote.python_in(env)
    return subprocess.run(
        [*python, "-m", "keras_psdist", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=env,
    )


def test_unknown_command_prints_usage_and_exits_2():
    result = _run_cli("nosuch")
    assert result.returncode == 2, result.stderr
    assert "unknown command 'nosuch'" in result.stderr
    assert "usage:" in result.stderr
    assert "demo" in result.stderr


def test_no_command_prints_usage_and_exits_2():
    result = _run_cli()
    assert result.returncode == 2, result.stderr
    assert "demo" in result.stderr


def test_help_lists_commands_and_exits_0():
    result = _run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout
    assert "--replicas" in result.stdout


@pytest.mark.parametrize(
    "flag, value",
    [
        ("replicas", "0"),
        ("epochs", "0"),
        ("batch-size", "-1"),
        ("seed", "-3"),
        ("num-byzantine", "-1"),
    ],
)
def test_invalid_flag_value_exits_2_without_traceback(flag, value):
    result = _run_cli("demo", f"--{flag}={value}")
    assert result.returncode == 2, result.stderr
    assert f"`--{flag}` must be >= " in result.stderr
    assert f"Received: --{flag}={value}" in result.stderr
    assert "Traceback" not in result.stderr


def test_replicas_zero_message():
    result = _run_cli("demo", "--replicas", "0")
    assert result.returncode == 2, result.stderr
    assert "Received: --replicas=0" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_flag_exits_2():
    result = _run_cli("demo", "--nosuch_flag=1")
    assert result.returncode == 2, result.stderr
    assert "Unknown flag --nosuch-flag." in result.stderr


def _banner_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if banner.is_tf_banner(line)]


def test_demo_trains_to_high_accuracy_and_prints_no_tensorflow_banner():
    result = _run_cli(
        "demo", "--epochs", "12", "--replicas", "4", timeout=600, own_log_level=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"test accuracy: ([0-9.]+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) >= 0.93, result.stdout
    # TensorFlow's start-up banner is left out unless --verbose (see
    # test_quiet_output; the --verbose case is the robust-rule demo below).
    assert not _banner_lines(result.stdout), result.stdout
    assert not _banner_lines(result.stderr), result.stderr


def test_demo_unknown_aggregator_exits_2_with_the_registry_error():
    result = _run_cli("demo", "--epochs", "1", "--aggregator", "krumm")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Unknown aggregator 'krumm'. Expected one of: mean" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_cli_knows_every_registered_id():
    # `--help` and the flag checks read the registries' ids.
    assert cli.AGGREGATOR_IDS == tuple(kpd.aggregators.names())
    assert cli.ATTACK_IDS == tuple(kpd.attacks.names())
    try:
        kpd.aggregators.get("krumm")
    except ValueError as e:
        expected = str(e)
    result = _run_cli("demo", "--aggregator", "krumm")
    assert f"keras-psdist: error: {expected}" in result.stderr


def test_demo_unknown_compressor_exits_2_with_the_registry_error():
    assert cli.COMPRESSOR_IDS == tuple(kpd.compression.names())
    result = _run_cli("demo", "--epochs", "1", "--compression", "topk")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Unknown compressor 'topk'. Expected one of: none" in result.stderr
    assert "Traceback" not in result.stderr


def _demo_accuracy(*args: str) -> tuple[float, str]:
    result = _run_cli("demo", *args, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"test accuracy: ([0-9.]+)", result.stdout)
    assert match, result.stdout
    return float(match.group(1)), result.stdout


def test_demo_trains_with_compression():
    """Top-k at 10 % trains as the same demo uncompressed does, within 3
    points after the same 3 epochs."""
    compressed, stdout = _demo_accuracy(
        "--epochs", "3", "--compression", "top_k(ratio=0.1)"
    )
    assert "compression: TopK(ratio=0.1)" in stdout
    uncompressed, _ = _demo_accuracy("--epochs", "3")
    assert compressed >= uncompressed - 0.03, (compressed, uncompressed)


def test_demo_attack_needs_num_byzantine():
    result = _run_cli("demo", "--attack", "sign_flip")
    assert result.returncode == 2, result.stderr
    assert "--attack` needs the attacked replicas" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_robust_rule_under_attack_reports_per_replica():
    result = _run_cli(
        "demo",
        *("--epochs", "2", "--replicas", "4", "--aggregator", "median"),
        *("--num-byzantine", "1", "--attack", "non_finite", "--verbose"),
        timeout=600,
        own_log_level=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # --verbose: TensorFlow's banner is shown, on stderr only.
    assert _banner_lines(result.stderr), result.stderr
    assert not _banner_lines(result.stdout), result.stdout
    assert "attack:     NonFinite(replicas=[3]" in result.stdout
    # In words a newcomer knows, not the report's name.
    words = kpd.callbacks.describe_report("extreme_fraction")
    assert words.startswith("share of its gradient's values set aside as extreme")
    fractions = re.search(
        rf"last epoch, per replica \(0 to 3\): {re.escape(words)}: (.*)",
        result.stdout,
    )
    assert fractions, result.stdout
    assert fractions.group(1).split()[-1] == "100%"
    # One short line per epoch after the progress bar, naming the replica.
    summary = f"Median, this epoch, per replica: {words}: lowest "
    lines = [line for line in result.stdout.splitlines() if summary in line]
    assert len(lines) == 2, result.stdout
    assert lines[-1].endswith("highest 100% (replica 3)"), lines
    assert "extreme_fraction" not in result.stdout
    assert "replica_" not in result.stdout


def test_demo_shows_the_undefended_mean_collapse():
    result = _run_cli(
        "demo",
        *("--epochs", "2", "--replicas", "4", "--aggregator", "mean"),
        *("--num-byzantine", "1", "--attack", "sign_flip"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "attack:     SignFlip(replicas=[3], scale=10.0)" in result.stdout
    assert "aggregator: mean, undefended" in result.stdout
    assert "baseline:   --num-byzantine 1: replica 3 attacks" in result.stdout
    # The baseline line says it; the library's warning is not repeated.
    assert "not guaranteed to withstand" not in result.stderr
    match = re.search(r"test accuracy: ([0-9.]+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) < 0.3, result.stdout
