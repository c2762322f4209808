"""`keras-psdist plan`: predicted updates/s and examples/s, the bottleneck,
and a recommended mode and ps count (`keras_psdist.plan`, docs/planning.md).

Its flags are defined here, on import (`main.py` imports this module); the
planner itself loads on use and imports no TensorFlow unless `--model`
names a `.keras` file.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence

from absl import flags

FLAGS = flags.FLAGS

flags.DEFINE_string(
    "model", None, "The .keras file to plan for (its trainable variables' sizes)."
)
flags.DEFINE_list(
    "variable_bytes",
    None,
    "Instead of --model: each variable's bytes, comma-separated, e.g. "
    "131072,2048,1048576,2048,4096,8.",
)
flags.DEFINE_integer("workers", None, "Number of worker tasks (required).")
flags.DEFINE_float(
    "link_mbit", None, "Each task's link, Mbit/s each way (default: unlimited)."
)
flags.DEFINE_float("cores_per_task", 1.0, "Cores each task may use.")
flags.DEFINE_integer("batch", 128, "Examples per worker step.")
flags.DEFINE_float(
    "step_ms",
    None,
    "The model's forward and backward pass per worker step on one core, ms "
    "(default: estimated from its parameters).",
)
flags.DEFINE_float(
    "machine_cores",
    None,
    "The cores every task shares, for one machine's test bed (default: each "
    "task has its own).",
)
flags.DEFINE_list(
    "modes",
    ["between-graph", "sync-replicas", "in-graph"],
    "The modes to predict, named as PSStrategy(mode=...) names them.",
)
flags.DEFINE_list(
    "compressions",
    ["none"],
    "Compressions to predict, e.g. none,fp16,top_k(ratio=0.01),"
    "top_k(ratio=0.01)@bfloat16 (@bfloat16: 16-bit reads).",
)
flags.DEFINE_bool(
    "exact", False, "Recommend sync-replicas or in-graph only (every gradient applied)."
)
flags.DEFINE_bool(
    "partitioned",
    False,
    "The variables are split evenly over the ps tasks (a partitioner), not "
    "placed whole.",
)
flags.DEFINE_bool("json", False, "Print the plan as JSON instead of a table.")

# The flags `plan` reads, in the order `--help` lists them.
FLAG_NAMES = (
    "model",
    "variable_bytes",
    "workers",
    "num_ps",
    "link_mbit",
    "cores_per_task",
    "batch",
    "step_ms",
    "machine_cores",
    "modes",
    "compressions",
    "exact",
    "partitioned",
    "json",
)

_EXAMPLE = "keras-psdist plan --variable-bytes 1048576,4096 --workers 4"


def _in_flag_words(message: str) -> str:
    """`plan`'s argument names as flags: `workers=0` -> `--workers=0`."""
    for name in FLAG_NAMES:
        flag = "--" + name.replace("_", "-")
        message = re.sub(rf"`{name}`", f"`{flag}`", message)
        message = re.sub(rf"(?<![\w-]){name}=", f"{flag}=", message)
    return message


def _error(message: str) -> int:
    print(f"keras-psdist: error: {message}", file=sys.stderr)
    return 2


def plan_command(args: Sequence[str] = ()) -> int:
    """Predict updates/s per mode and ps count, and recommend (no training)."""
    if FLAGS.workers is None:
        return _error(f"`plan` needs --workers, e.g. `{_EXAMPLE}`.")
    sizes = None
    if FLAGS.variable_bytes is not None:
        try:
            sizes = [int(size) for size in FLAGS.variable_bytes]
        except ValueError:
            return _error(
                "`--variable-bytes` takes comma-separated integers, e.g. "
                f"1048576,4096. Received: --variable-bytes="
                f"{','.join(FLAGS.variable_bytes)}"
            )
    from keras_psdist.planning import plan

    try:
        result = plan(
            FLAGS.model,
            variable_bytes=sizes,
            workers=FLAGS.workers,
            num_ps=FLAGS.num_ps if FLAGS["num_ps"].present else None,
            link_mbit=FLAGS.link_mbit,
            cores_per_task=FLAGS.cores_per_task,
            batch=FLAGS.batch,
            step_ms=FLAGS.step_ms,
            machine_cores=FLAGS.machine_cores,
            modes=FLAGS.modes,
            compressions=FLAGS.compressions,
            exact=FLAGS.exact,
            partitioned=FLAGS.partitioned,
        )
    except ValueError as e:
        return _error(_in_flag_words(str(e)))
    print(json.dumps(result.to_dict(), indent=1) if FLAGS.json else result)
    return 0
