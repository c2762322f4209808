"""`keras-psdist launch`: a whole parameter-server cluster on this machine.

    arguments.py  `launch`'s arguments, checked before anything starts
    settings.py   those arguments, checked, as one frozen `LaunchSettings`
    run.py        `launch`: pick ports, start a `keras-psdist serve` process
                  per server task, run the training command once per training
                  task with its TF_CONFIG, watch them, stop every process
    deadline.py   `timeout_s`, counted from when training starts
    elastic_workers.py    `max_workers`: workers that join and leave
    evaluator_process.py  `evaluator`: the side-car evaluator's process
    processes.py  the children: prefixed output, signals, process groups
    banner.py     TensorFlow's start-up banner, left out of the output

Pure process management: nothing here imports TensorFlow.
"""

from keras_psdist.cluster.launcher.arguments import MODES
from keras_psdist.cluster.launcher.run import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_TIMEOUT,
    GRACE_S,
    MAX_ATTEMPTS,
    SERVER_COMMAND,
    SERVER_LOSS_GRACE_S,
    launch,
)

__all__ = [
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_TIMEOUT",
    "GRACE_S",
    "MAX_ATTEMPTS",
    "MODES",
    "SERVER_COMMAND",
    "SERVER_LOSS_GRACE_S",
    "launch",
]
