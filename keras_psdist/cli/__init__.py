"""The `keras-psdist` command: `demo`, `launch`, `serve`, `slurm`, `k8s`, `plan`.

main.py  the argument parser and the commands
demo.py  `keras-psdist demo`: digits on logical CPU replicas
plan.py  `keras-psdist plan`: its flags and command (keras_psdist.planning)
"""

from keras_psdist.cli.main import run

__all__ = ["run"]
