"""The harness every benchmark script shares (no TensorFlow import at load).

Not a benchmark: a package of one concern per module, whose names the
scripts take from here (``import harness``, ``from harness import Column``;
run from ``benchmarks/``, as ``python benchmarks/NAME.py`` does):

* `arguments`: `BenchmarkParser` (``--json``, ``--plot``, ``--quick``,
  ``--seed``, ``--rounds`` / ``--repeats``, the children's ``--role``) and
  the argparse types `positive`, `positive_float`, `non_negative_float`,
  `int_list`, `seed_list`, `name_list`;
* `configs`: the rule configurations of the robustness benchmarks,
  ``[pre>...>]rule[+wm[BETA]]`` (`parse_config`, `compression_of`, `config_names`);
* `rounds`: `interleaved_rounds` runs configurations in alternating rounds
  (A B, B A, ... or A B, A B, ...) and returns a `Rounds`: per-configuration
  samples, medians, ratios to a baseline paired round by round;
* `stats`: `median_or_none`, `paired_ratios`, `ratio`; over repeated runs,
  `chance_gap` (how far the worst of k runs falls by chance) and
  `points_below`;
* `tables`: `text_table` / `format_row` (fixed width), `markdown_table`,
  `median_table` / `median_row`, `attack_costs` (what an attack costs on
  average), cells `times`, `fmt`, `value_range`; `keep_table` keeps a table
  for the run's JSON;
* `machine`: `environment` (machine, load average, versions, git commit),
  `loadavg`;
* `results`: `write_results` (JSON with the environment, the command line
  and every table the run printed), `finish` (the common end of the
  cluster benchmarks), `render` (a result's tables as markdown again:
  ``python benchmarks/harness render benchmarks/results/NAME.json``);
* `plotting`: `figure` (a matplotlib figure saved as PNG);
* `processes`: local clusters' runs: `run_dir`, `run_process`,
  `read_reports`, `RunFailed`;
* `checkout`: `REPO_ROOT`, `RESULTS`, `prepare_tensorflow`,
  `ensure_importable`, `use_checkout`;
* `progress`: `log`, `log_failure` (stderr).

What several scripts train, imported by name (these import TensorFlow):
`harness.mlp` (the MLP and synthetic data of `strategies.py`, `timed_fit`),
`harness.digits` (`robustness.py`'s digits runs under attack) and
`harness.tf_keras_ps` (tf_keras's `ParameterServerStrategy` baseline; it
imports TensorFlow only in the coordinator), and `harness.host_runs` (one
run of a script's children on separate hosts, network namespaces, with
the hosts' link counters and CPU: `scaling.py`'s and `plan_check.py`'s).
A script's second study lives here too, run by a flag of the script:
`harness.graph_ops` and `harness.step_ablations` (`strategies.py --ops`,
`--ablations`), `harness.robustness_noise` (`robustness.py --noise`).
No script imports another.

``python -m pytest tests/test_benchmark_harness.py`` runs the examples.
"""

from .arguments import (
    BenchmarkParser,
    given,
    int_list,
    name_list,
    non_negative_float,
    positive,
    positive_float,
    seed_list,
)
from .checkout import (
    REPO_ROOT,
    RESULTS,
    ensure_importable,
    prepare_tensorflow,
    use_checkout,
)
from .configs import compression_of, config_names, parse_config
from .machine import cpu_model, environment, git_commit, loadavg
from .plotting import check_available as check_plotting
from .plotting import figure, pyplot
from .processes import (
    RunFailed,
    chief_of_worker_job,
    launch_logged,
    read_reports,
    run_dir,
    run_process,
    tail,
)
from .progress import log, log_failure
from .results import command_line, finish, render, save_json, write_results
from .rounds import Rounds, interleaved_rounds, ok
from .stats import chance_gap, median_or_none, paired_ratios, points_below, ratio
from .tables import (
    Column,
    attack_costs,
    fmt,
    format_row,
    keep_table,
    markdown_table,
    median_row,
    median_table,
    text_table,
    times,
    value_range,
)

__all__ = [
    "chief_of_worker_job",
    "REPO_ROOT",
    "RESULTS",
    "BenchmarkParser",
    "Column",
    "Rounds",
    "RunFailed",
    "attack_costs",
    "chance_gap",
    "check_plotting",
    "command_line",
    "compression_of",
    "config_names",
    "cpu_model",
    "ensure_importable",
    "environment",
    "figure",
    "finish",
    "fmt",
    "format_row",
    "git_commit",
    "int_list",
    "interleaved_rounds",
    "launch_logged",
    "keep_table",
    "loadavg",
    "log",
    "log_failure",
    "markdown_table",
    "median_or_none",
    "median_row",
    "median_table",
    "given",
    "name_list",
    "non_negative_float",
    "ok",
    "paired_ratios",
    "parse_config",
    "points_below",
    "positive",
    "positive_float",
    "prepare_tensorflow",
    "pyplot",
    "ratio",
    "read_reports",
    "render",
    "run_dir",
    "run_process",
    "save_json",
    "seed_list",
    "tail",
    "text_table",
    "times",
    "use_checkout",
    "value_range",
    "write_results",
]
