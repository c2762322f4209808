"""The benchmark scripts parse their arguments, and the shared harness's
examples hold (no benchmark is run here: speed is measured by the scripts)."""

import ast
import doctest
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def _forget(*names):
    """Drops `names` and their submodules from `sys.modules`."""
    for module in list(sys.modules):
        if module.split(".")[0] in names:
            del sys.modules[module]


@pytest.fixture
def fresh_harness(monkeypatch):
    """`benchmarks/harness/` imported afresh, as a script run from
    `benchmarks/` imports it, and forgotten after the test."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget("harness")
    yield importlib.import_module("harness")
    _forget("harness")


def test_the_harness_examples_hold(fresh_harness):
    attempted = 0
    for info in pkgutil.iter_modules(fresh_harness.__path__):
        if info.name == "__main__":  # the command line: it edits sys.path
            continue
        module = importlib.import_module(f"harness.{info.name}")
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failed == 0, module.__name__
        attempted += tried
    assert attempted > 0


@pytest.mark.parametrize("script", ["robustness_protocol", "robustness_processes"])
def test_the_robustness_protocols_examples_hold(fresh_harness, script):
    # Their pieces: a config's momentum set, the heterogeneity bound's term,
    # the worst cell (each with its numbers worked by hand in the example).
    module = importlib.import_module(script)
    try:
        failed, tried = doctest.testmod(module)
    finally:
        del sys.modules[script]
    assert failed == 0 and tried > 0


def _imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_benchmark_script_imports_another():
    # What scripts share lives in the harness package; a script (or a
    # child process's script, `_*.py`) imports none of the others.
    scripts = sorted(BENCHMARKS.glob("*.py"))
    stems = {p.stem for p in scripts}
    imports = {p.name: sorted(_imported_modules(p) & stems) for p in scripts}
    assert {name: found for name, found in imports.items() if found} == {}


# Runs `python SCRIPT ARGS...` for every call in one process, so TensorFlow
# (which each script imports first, ~7 s of CPU) is imported once, not once
# per script: each script runs as `__main__` with its own argv, as from the
# command line, and its exit code and output are kept apart.
_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
results = []
for path, *args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [path, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        code, err = 1, io.StringIO(err.getvalue() + traceback.format_exc())
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def _robustness_payload(seed, accuracies, epochs=20):
    """A `robustness.py` JSON: `accuracies[(rule, attack)]`, every run ok."""
    rules = sorted({rule for rule, _ in accuracies}, key=lambda r: r != "mean")
    attacks = ["none", "alie", "optimal_alie"]
    return {
        "config": {
            "seed": seed,
            "data": "iid",
            "epochs": epochs,
            "rules": rules,
            "attacks": attacks,
            "argv": ["--seed", str(seed)],
        },
        "runs": [
            {"rule": rule, "attack": attack, "status": "ok", "accuracy": accuracy}
            for (rule, attack), accuracy in accuracies.items()
        ],
    }


_SEED_0 = {
    ("mean", "none"): 0.98,
    ("mean", "alie"): 0.93,
    ("mean", "optimal_alie"): 0.2,
    ("trimmed_mean+wm", "none"): 0.97,
    ("trimmed_mean+wm", "alie"): 0.96,
    ("trimmed_mean+wm", "optimal_alie"): 0.95,
}
_SEED_1 = {
    ("mean", "none"): 0.97,
    ("mean", "alie"): 0.93,
    ("mean", "optimal_alie"): 0.2,
    ("trimmed_mean+wm", "none"): 0.965,
    ("trimmed_mean+wm", "alie"): 0.90,
    ("trimmed_mean+wm", "optimal_alie"): 0.93,
}


# A rule with and without worker momentum: +wm below raw on the clean run only.
_MOMENTUM = {
    ("mean", "none"): 0.98,
    ("mean", "alie"): 0.93,
    ("mean", "optimal_alie"): 0.2,
    ("median", "none"): 0.97,
    ("median+wm", "none"): 0.96,
    ("median", "alie"): 0.90,
    ("median+wm", "alie"): 0.95,
    ("median", "optimal_alie"): 0.50,
    ("median+wm", "optimal_alie"): 0.94,
}


# step_time_rules.worker_momentum_checks on made-up rounds: median+wm is 1.2x
# median in every round, arc>geometric_median+wm0.95 1.04x its rule, trimmed
# mean+wm runs without its rule, and krum failed.
_WORKER_MOMENTUM_PROBE = """
import step_time_rules as s
def case(rule, times, error=None):
    runs = [{"round": r, "loop_ms": t} for r, t in enumerate(times)]
    return s.Case(rule, runs=[] if error else runs, error=error)
cases = [
    case("mean", [10, 10, 10]),
    case("median", [10, 11, 12]),
    case("median+wm", [12, 13.2, 14.4]),
    case("arc>geometric_median", [20, 20, 20]),
    case("arc>geometric_median+wm0.95", [20.8, 20.8, 20.8]),
    case("trimmed_mean+wm", [12, 12, 12]),
    case("krum", [], error="ValueError: boom"),
    case("krum+wm", [12, 12, 12]),
]
print("\\n".join(s.worker_momentum_checks(cases)))
"""


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
    """`SCRIPT --help` for every script, then `robustness.py --across-seeds`
    on two seeds' results and on two runs of different setups, and
    `robustness.py` with options that contradict each other: their
    `{"code", "stdout", "stderr"}` and the markdown written."""
    tmp = tmp_path_factory.mktemp("benchmark_scripts")
    paths = {}
    for name, payload in {
        "seed0": _robustness_payload(0, _SEED_0),
        "seed1": _robustness_payload(1, _SEED_1),
        "other_setup": _robustness_payload(1, _SEED_1, epochs=10),
        "momentum": _robustness_payload(0, _MOMENTUM),
    }.items():
        paths[name] = tmp / f"{name}.json"
        paths[name].write_text(json.dumps(payload))
    robustness = str(BENCHMARKS / "robustness.py")
    out = tmp / "seeds.md"
    calls = [[str(BENCHMARKS / s), "--help"] for s in SCRIPTS]
    for a, b in (("seed0", "seed1"), ("seed0", "other_setup")):
        calls.append(
            [
                robustness,
                "--across-seeds",
                f"{paths[a]},{paths[b]}",
                "--output",
                str(out),
                "--section",
                "seeds",
            ]
        )
    calls.append([robustness, "--input", "arrays", "--data", "dirichlet:0.5"])
    calls.append([robustness, "--noise", "1"])
    protocol = str(BENCHMARKS / "robustness_protocol.py")
    processes = str(BENCHMARKS / "robustness_processes.py")
    calls += [
        [protocol, "momentum", str(paths["momentum"]), "--output", str(tmp / "m.md")],
        [protocol, "heatmap", "--rules", "smea+wm", "--fs", "1,4"],
        [protocol, "tune", "--rules", "mean,smea+wm"],
        [processes, "--attacks", "none,alie"],
        [processes, "--attackers", "0,7"],
        [processes, "--batch", "100"],
    ]
    calls.append([robustness, "--noise", "3", "--epochs", "3", "--replicas", "4"])
    calls.append([robustness, "--noise", "8", "--attacks", "optimal_alie,bogus"])
    probe = tmp / "worker_momentum_checks.py"
    probe.write_text(_WORKER_MOMENTUM_PROBE)
    calls.append([str(probe)])
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        # As when run as `python benchmarks/SCRIPT`: `import harness` works.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(BENCHMARKS), os.environ.get("PYTHONPATH")) if p
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    helps = dict(zip(SCRIPTS, results, strict=False))
    return helps, results[len(SCRIPTS) :], out.read_text()


@pytest.mark.xdist_group("benchmark_help")
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script_runs, script):
    result = script_runs[0][script]
    assert result["code"] == 0, result["stderr"][-2000:]
    assert "--json" in result["stdout"] or "usage" in result["stdout"]


@pytest.mark.xdist_group("benchmark_help")
def test_across_seeds_reports_each_configurations_worst_case_of_every_seed(
    script_runs,
):
    _, (across, mismatch, *_), markdown = script_runs
    assert across["code"] == 0, across["stderr"][-2000:]
    [row] = [line for line in markdown.splitlines() if "`trimmed_mean+wm`" in line]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # Per seed: clean / worst (attack); the worst over both; and the largest
    # drop below the seed's own clean mean (seed 1: 97.0 - 90.0).
    assert cells[1:] == [
        "97.0 / 95.0 (opt. ALIE)",
        "96.5 / 90.0 (ALIE)",
        "90.0",
        "7.0",
    ]
    assert "`mean`" not in row and "| `mean`" not in markdown  # the baseline
    # Runs of another setup are refused, naming what differs.
    assert mismatch["code"] != 0
    assert "differs from" in mismatch["stderr"] and "epochs" in mismatch["stderr"]


@pytest.mark.xdist_group("benchmark_help")
def test_robustness_refuses_arrays_for_non_iid_data_naming_the_fix(script_runs):
    _, (_, _, arrays_non_iid, *_), _ = script_runs
    assert arrays_non_iid["code"] == 2
    assert (
        "--input arrays feeds every replica from all of x" in (arrays_non_iid["stderr"])
    )
    assert "Leave --input out" in arrays_non_iid["stderr"]


@pytest.mark.xdist_group("benchmark_help")
def test_robustness_noise_needs_two_runs_to_measure_a_spread(script_runs):
    _, (_, _, _, one_run, *_), _ = script_runs
    assert one_run["code"] == 2
    assert "--noise must be at least 2 runs (got 1)" in one_run["stderr"]


@pytest.mark.xdist_group("benchmark_help")
def test_worker_momentum_is_checked_against_its_own_rule(script_runs):
    _, (*_, probe), _ = script_runs
    assert probe["code"] == 0, probe["stderr"][-2000:]
    assert probe["stdout"].splitlines() == [
        "FAIL worker momentum on median: median+wm 1.20x median's in-loop step "
        "time (target <= 1.05x)",
        "PASS worker momentum on arc>geometric_median: arc>geometric_median+wm0.95 "
        "1.04x arc>geometric_median's in-loop step time (target <= 1.05x)",
        "n/a  worker momentum on trimmed_mean <= 1.05x: run trimmed_mean beside "
        "trimmed_mean+wm to measure it",
        "n/a  worker momentum on krum <= 1.05x: krum ValueError: boom",
    ]


@pytest.mark.xdist_group("benchmark_help")
def test_robustness_noise_names_an_unknown_attack_and_the_choices(script_runs):
    _, (*_, unknown, _), _ = script_runs
    assert unknown["code"] == 2
    assert "unknown attack 'bogus': one of none,sign_flip," in unknown["stderr"]
    assert "optimal_alie" in unknown["stderr"].split("one of")[1]


@pytest.mark.xdist_group("benchmark_help")
def test_robustness_noise_refuses_a_setup_it_would_not_run(script_runs):
    """`robustness.py --noise` measures the draw of the table's default
    setup: a flag that changes the setup is refused, named, not ignored."""
    _, (*_, changed, _, _), _ = script_runs
    assert changed["code"] == 2
    assert "--epochs, --replicas would change it" in changed["stderr"]


@pytest.mark.xdist_group("benchmark_help")
def test_the_momentum_check_names_each_attack_where_momentum_is_below(script_runs):
    _, results, _ = script_runs
    check = results[4]
    assert check["code"] == 0, check["stderr"][-2000:]
    [row] = [line for line in check["stdout"].splitlines() if "`median`" in line]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells == [
        "`median`",
        "iid, seed 0 (`momentum.json`)",
        "2/3",
        "clean 97.0 → 96.0",
    ]


@pytest.mark.xdist_group("benchmark_help")
def test_the_protocol_and_process_table_refuse_bad_input_saying_the_fix(script_runs):
    _, results, _ = script_runs
    heatmap, tune, omniscient, chief, batch = results[5:10]
    assert (
        heatmap["code"] == 2
        and "each f in 1 .. 3 (f < n/2) for n = 8" in (heatmap["stderr"])
    )
    assert tune["code"] == 2 and "the mean is the reference" in tune["stderr"]
    assert omniscient["code"] == 2
    assert "--attacks alie: not run by a worker alone" in omniscient["stderr"]
    assert "choose from none, sign_flip, scale" in omniscient["stderr"]
    assert chief["code"] == 2 and "worker 0 is the chief" in chief["stderr"]
    assert batch["code"] == 2 and "give a multiple of --workers" in batch["stderr"]


# ------------------------------------------------ results: JSON and render


@pytest.fixture
def harness(fresh_harness, monkeypatch):
    """A fresh `benchmarks/harness/`, the machine description its results
    record stubbed (the real one imports TensorFlow)."""
    monkeypatch.setattr(fresh_harness.results, "environment", lambda: {"cpu_count": 2})
    return fresh_harness


def _render(*args):
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "harness"), "render", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_run_json_keeps_its_command_and_tables_and_renders_them(
    harness, tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["benchmarks/demo.py", "--rules", "a b"])
    column = harness.Column
    harness.text_table(
        [column("rule", 8, "<"), column("ms/step", 8)],
        [["mean", "1.25"], ["a|b", "2.50"], "krum failed: ValueError"],
    )
    harness.median_table(
        "Async", "examples/s", [("1 worker", 9.0, [8.0, 10.0], ".1f")], 12
    )
    path = harness.write_results(tmp_path / "demo.json", {"results": [1, 2]})
    payload = json.loads(path.read_text())
    assert payload["command"] == "python benchmarks/demo.py --rules 'a b'"
    assert payload["results"] == [1, 2] and payload["environment"] == {"cpu_count": 2}
    assert [t["columns"] for t in payload["tables"]] == [
        ["rule", "ms/step"],
        ["Async", "examples/s", "min..max"],
    ]

    result = _render(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "<!-- python benchmarks/demo.py --rules 'a b' -->\n"
        "\n"
        "table 1:\n"
        "\n"
        "| rule | ms/step |\n"
        "|---|---|\n"
        "| mean | 1.25 |\n"
        "| a\\|b | 2.50 |\n"
        "\n"
        "krum failed: ValueError\n"
        "\n"
        "table 2:\n"
        "\n"
        "| Async | examples/s | min..max |\n"
        "|---|---|---|\n"
        "| 1 worker | 9.0 | 8.0..10.0 |\n"
    )
    only = _render(path, "--table", 2)
    assert only.returncode == 0 and "table 1:" not in only.stdout
    assert "| 1 worker | 9.0 | 8.0..10.0 |" in only.stdout

    # The tables went with the first JSON: the next run's starts empty.
    again = harness.write_results(tmp_path / "next.json", {})
    assert json.loads(again.read_text())["tables"] == []
    empty = _render(again)
    assert empty.returncode == 1
    assert "records no table" in empty.stderr
    assert "Run it again: python benchmarks/demo.py --rules 'a b'" in empty.stderr
    beyond = _render(path, "--table", 3)
    assert beyond.returncode == 1
    assert "has tables 1 to 2. Received: --table 3" in beyond.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_writes_its_json_under_results_with_the_command(script):
    # Read from the source: each parser names the default JSON under
    # benchmarks/results (BenchmarkParser's `name=`, or RESULTS itself), and
    # the JSON goes through write_results (directly or by `finish`), which
    # records the command line and the tables.
    source = (BENCHMARKS / script).read_text()
    assert "BenchmarkParser(" in source and "name=" in source or "RESULTS /" in source
    assert "write_results(" in source or "finish(" in source
    assert "if args.json:" not in source  # written on every run


# ------------------------------- cluster.py: the comparison with tf_keras


@pytest.fixture
def cluster_bench(monkeypatch):
    """`benchmarks/cluster.py` imported as a module (no TensorFlow: it
    imports TensorFlow only in the processes it starts)."""
    # Its `harness.prepare_tensorflow()` sets nothing: conftest.py has set
    # both variables.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget("cluster", "harness")
    yield importlib.import_module("cluster")
    _forget("cluster", "harness")


def test_the_cluster_benchmarks_examples_hold(cluster_bench):
    # `harness.tf_keras_ps` checks a cluster of given servers before starting
    # anything (its coordinator's side needs TensorFlow and is not run here).
    for module in (cluster_bench, cluster_bench.tf_keras_ps):
        failed, attempted = doctest.testmod(module)
        assert attempted > 0 and failed == 0, module.__name__
    with pytest.raises(ValueError, match="Received: num_ps=0"):
        cluster_bench.tf_keras_ps.check_args(
            num_workers=2, num_ps=0, steps_per_epoch=80, steps_per_execution=10
        )


def test_the_tf_keras_comparison_is_fair_and_rotates(cluster_bench, monkeypatch):
    # Every side trains the same examples per epoch with the same
    # steps_per_execution, the order turns each round, and the ratios'
    # spread says when the rounds disagree on which side is faster.
    calls = []
    async_rates = iter([900.0, 1100.0, 1200.0, 950.0])  # tf_keras: 1000

    def tf_keras(work, **kwargs):
        calls.append(("tf_keras", kwargs))
        return {"examples_per_s": 1000.0}

    def ours(work, role, num_ps, num_workers, args, steps_per_execution=1):
        calls.append(
            (
                role,
                {
                    **vars(args),
                    "num_ps": num_ps,
                    "num_workers": num_workers,
                    "steps_per_execution": steps_per_execution,
                },
            )
        )
        rate = next(async_rates) if role == "async" else 1300.0
        count = num_workers if role == "async" else 1
        return [
            {
                "examples": rate / count,
                "timed_start_wall": 0.0,
                "timed_end_wall": 1.0,
                "epoch_s": [1.0],
            }
            for _ in range(count)
        ]

    monkeypatch.setattr(cluster_bench.tf_keras_ps, "run", tf_keras)
    monkeypatch.setattr(cluster_bench, "run_cluster", ours)
    args = cluster_bench.parse_args(["--only", "vs-tf-keras", "--vs-lengths", "40"])
    assert args.rounds >= 4 and args.steps_per_execution == 10
    rounds = []
    cluster_bench.measure_vs_tf_keras(None, args, rounds)

    assert [e["order"] for e in rounds] == [
        ["tf_keras", "async", "in-graph"],
        ["async", "in-graph", "tf_keras"],
        ["in-graph", "tf_keras", "async"],
        ["tf_keras", "async", "in-graph"],
    ]
    for side, kwargs in calls:
        assert kwargs["num_workers"] == 2 and kwargs["num_ps"] == 1
        assert kwargs["steps_per_execution"] == 10
        if side == "tf_keras":
            # Twice the steps, each one worker's batch: 40 global batches.
            assert kwargs["steps_per_epoch"] * kwargs["per_worker_batch"] == 40 * 256
        else:
            assert (kwargs["steps"], kwargs["batch"], kwargs["finite"]) == (
                40,
                256,
                True,
            )

    summary = cluster_bench.summarize_vs_tf_keras(rounds, args)
    row = summary["lengths"][40]
    assert row["examples_per_epoch"] == 40 * 256
    spread = row["async_ratio"]
    assert (spread["min"], spread["max"], spread["straddles_1"]) == (0.9, 1.2, True)
    assert spread["median"] == pytest.approx(1.025)
    assert not row["in-graph_ratio"]["straddles_1"]
    text = cluster_bench.format_vs_tf_keras(summary, args)
    assert "async / tf_keras at 40-step epochs straddles 1.0 (0.90..1.20)" in text
    assert "in-graph / tf_keras at 40-step epochs straddles" not in text


def test_an_attack_takes_arguments_as_a_stage_does(fresh_harness):
    # robustness.py --attacks 'rop,rop(z=3)' sweeps ROP's length in one run.
    import argparse

    digits = importlib.import_module("harness.digits")
    assert digits.attack_list("none,rop(z=3),alie(z=1.5),rop(z=3)") == [
        "none",
        "rop(z=3)",
        "alie(z=1.5)",
    ]
    rop = digits.ATTACKS["rop(z=3)"].build([6, 7], 0)
    assert type(rop).__name__ == "ROP" and rop.z == 3
    assert digits.ATTACKS["rop(z=3)"].label == "ROP z=3"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'ropp\(z=1\)'.*ids: "):
        digits.attack_list("ropp(z=1)")


@pytest.mark.timeout(300)
def test_plan_check_fit_keeps_the_ps_costs_it_is_told_to():
    """`plan_check.py --fit --keep ps_ms_per_mb`: runs that all move the
    same bytes cannot tell the per-MB cost from the fixed one; kept, the
    others are fitted around it."""
    results = BENCHMARKS / "results" / "scaling_ps_threads.json"
    command = [sys.executable, str(BENCHMARKS / "plan_check.py"), "--fit", str(results)]
    lines = {}
    for keep in ([], ["--keep", "ps_ms_per_mb"]):
        done = subprocess.run(
            command + keep, capture_output=True, text=True, timeout=240, check=True
        )
        lines[bool(keep)] = {
            line.split()[0]: line for line in done.stdout.splitlines() if line.strip()
        }
    assert "kept" in lines[True]["ps_ms_per_mb"], lines[True]["ps_ms_per_mb"]
    assert "0.2081 -> 0.2081" in lines[True]["ps_ms_per_mb"]
    assert "least squares" in lines[True]["ps_fixed_ms"]
    assert "least squares" in lines[False]["ps_ms_per_mb"]
    # One model: its variables cost the same in every run, so kept.
    assert "kept" in lines[False]["ps_apply_ms_per_variable"]


@pytest.mark.timeout(300)
def test_plan_check_fit_predicts_each_run_with_its_own_model(fresh_harness):
    """Runs of two MLPs (6 and 48 variables) fitted together: each file's
    runs are predicted with the model its command trained, which tells the
    ps's cost per variable from its cost per byte."""
    _forget("plan_check")
    plan_check = importlib.import_module("plan_check")
    files = [str(BENCHMARKS / "results" / f"scaling_ps_threads{end}.json")
             for end in ("", "_deep")]  # fmt: skip
    runs, cores = plan_check.read_runs(files)
    models = {
        (r["file"], r["hidden"], r["depth"], r["model_step_ms"] > 0) for r in runs
    }
    assert models == {(files[0], 512, 2, True), (files[1], 128, 23, True)}
    assert [len(plan_check.run_sizes(r)) for r in (runs[0], runs[-1])] == [6, 48]
    costs, notes = plan_check.fit(runs, cores, batch=128)
    assert "least squares" in notes["ps_apply_ms_per_variable"]
    assert costs.ps_apply_ms_per_variable > 0
    assert 0.3 <= costs.shared_core_use <= 1


def test_plan_check_predicts_each_configuration_against_its_rounds_median(
    fresh_harness,
):
    """`plan_check.py --rounds 3`: a configuration's runs merge into one
    entry with the medians of the rounds that finished; one that failed in
    every round keeps its error; `--fit` reads the runs, not the medians."""
    _forget("plan_check")
    plan_check = importlib.import_module("plan_check")

    def run(kind, examples, round_, error=None):
        entry = {"kind": kind, "workers": 2, "num_ps": 1, "mbit": None,
                 "compression": "none", "round": round_}  # fmt: skip
        if error:
            return {**entry, "error": error}
        return {**entry, "examples_per_s": examples, "updates_per_s": examples / 128}

    runs = [run("async", 100.0, 0), run("sync", 0, 0, "lost"),
            run("async", 300.0, 1), run("sync", 0, 1, "lost again"),
            run("async", 0, 2, "timed out")]  # fmt: skip
    merged = plan_check._medians(runs)
    assert [m["kind"] for m in merged] == ["async", "sync"]
    assert merged[0]["examples_per_s"] == 200.0
    assert merged[0]["examples_per_s_rounds"] == [100.0, 300.0]
    assert merged[1]["error"] == "lost"


@pytest.mark.timeout(300)
def test_the_committed_costs_predict_the_ps_cpu_of_their_runs(fresh_harness):
    """`Costs()`'s defaults were fitted to these runs (one ps task, two
    MLPs, async, sync and in-graph at W = 1, 2, 4, two rounds): the planner predicts
    the ps task's CPU per update of each within 25 % at the median, and
    the same file's tf_keras runs are not among them."""
    _forget("plan_check")
    plan_check = importlib.import_module("plan_check")
    from keras_psdist.planning import Costs

    files = [str(BENCHMARKS / "results" / f"scaling_step_loop{end}.json")
             for end in ("", "_deep")]  # fmt: skip
    runs, cores = plan_check.read_runs(files)
    measured = [r for r in runs if r.get("ps_cpu_ms_per_update") is not None]
    assert {r["kind"] for r in measured} == {"async", "sync", "in-graph"}
    errors = sorted(
        abs(
            plan_check.predict(r, cores, Costs(), 128).ps_cpu_ms_per_update
            / r["ps_cpu_ms_per_update"]
            - 1
        )
        for r in measured
    )
    assert len(errors) == 36, len(errors)  # 18 configurations, 2 rounds
    assert errors[len(errors) // 2] <= 0.25, errors
