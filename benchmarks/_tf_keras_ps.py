"""The coordinator of a tf_keras `ParameterServerStrategy` run, in a process
of its own: started by `harness.tf_keras_ps.run` (with TF_CONFIG naming this
task the chief)::

    python benchmarks/_tf_keras_ps.py --out-dir DIR --steps-per-epoch N \\
        --per-worker-batch B --epochs E [--steps-per-execution K] [--seed S]

trains as `harness.tf_keras_ps.coordinate` and writes its report to
``DIR/coordinator.json``.
"""

import sys

from harness.tf_keras_ps import main

if __name__ == "__main__":
    sys.exit(main())
