"""The digits MLP with top-k compression, on a cluster.

Run by `tests/test_compression_cluster.py` under `keras-psdist launch`: in-graph
as the chief (1 ps task, 2 worker tasks), or between-graph as each worker
(MODE `between-graph`; the test runs 1 worker task, which also reads the
variables in bfloat16, `read_dtype`, and its two 64 x 64 kernels by their
largest changes, `read_compression`):

    python compression_job.py OUT_DIR [MODE]

writes `OUT_DIR/report.json` (the accuracy and where each replica's
residuals live) and `OUT_DIR/weights.npz`, which the test compares with the
same replicas in one process.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import digits_job  # noqa: E402  (this directory: sys.path[0] or conftest.py)
import numpy as np  # noqa: E402

COMPRESSION = "top_k(ratio=0.1)"
READ_COMPRESSION = "top_k(ratio=0.1)"


def main(out_dir, mode="in-graph"):
    import keras_psdist as kpd
    from keras_psdist.variables import narrow_reads

    narrowed = []
    read = narrow_reads.narrowed_read

    def counted(variable, dtype):
        narrowed.append(variable.device)
        return read(variable, dtype)

    narrow_reads.narrowed_read = counted
    between = mode == "between-graph"
    strategy = kpd.PSStrategy(
        mode=mode,
        compression=COMPRESSION,
        read_dtype="bfloat16" if between else None,
        read_compression=READ_COMPRESSION if between else None,
    )
    model = digits_job.build(strategy)
    _, accuracy = digits_job.train(model)
    report = {
        "mode": strategy.extended.topology.mode,
        "accuracy": accuracy,
        "compression": repr(strategy.extended.compression),
        "state_devices": [v.device for v in strategy.extended.training_state.variables],
        "read_dtype": strategy.extended.read_dtype
        and strategy.extended.read_dtype.name,
        # The reads a traced step narrowed, by the variable's device.
        "narrowed_reads": narrowed,
        # The copies of the variables read by their change: (ps side,
        # worker side).
        "read_copies": [
            [copy.seen.device, copy.local.device]
            for copy in strategy.extended.delta_reads.copies()
        ]
        if between
        else [],
    }
    np.savez(os.path.join(out_dir, "weights.npz"), *[w.numpy() for w in model.weights])
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f)
    print(f"compression: accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
