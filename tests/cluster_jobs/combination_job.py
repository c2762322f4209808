"""Cells of the combination matrix across worker processes, one after another.

Run by `tests/test_combinations.py` (and `benchmarks/combinations.py
--across-workers`) under `keras-psdist launch --mode between-graph`:

    python combination_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON: `{"cells": [[mode, compressor, configuration, attack], ...]}`,
`mode` one of `combinations.WORKER_MODES`. Every worker trains every cell in order,
each under a strategy of its own (`combinations.run_cell_on_this_worker`),
and writes `OUT_DIR/worker_<i>.json`: `{"cells": [Cell as a dict, ...]}`.
"""

import dataclasses
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from keras_psdist.cluster import runtime  # noqa: E402
from keras_psdist.testing import combinations  # noqa: E402


def main(out_dir, config):
    data = combinations.digits()
    cells = [
        dataclasses.asdict(combinations.run_cell_on_this_worker(*cell, data=data))
        for cell in config["cells"]
    ]
    topology_config = runtime.resolve_config(None)
    worker = topology_config.task_id if topology_config else 0
    with open(os.path.join(out_dir, f"worker_{worker}.json"), "w") as f:
        json.dump({"cells": cells}, f)
    for cell in cells:
        outcome = cell["refused"] or (
            f"{cell['accuracy']:.3f}, loss per epoch "
            + " ".join(f"{x:.3f}" for x in cell["losses"])
        )
        print(
            f"worker {worker}: {cell['extra']}: {cell['compressor']} / "
            f"{cell['configuration']} / {cell['attack']}: {outcome}"
        )


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
