"""The `keras-psdist` command: `demo`, `launch`, `serve`, `slurm`, `k8s`, `plan`.

main.py      the command table, the usage text, the parsing of flags
options.py   every command's flags: definitions, minimums, spelling, errors
commands.py  `demo`, `serve`, `launch`, `slurm`, `k8s`: checks, then the work
demo.py      `keras-psdist demo`'s training: digits on logical CPU replicas
plan.py      `keras-psdist plan`: its flags and command (keras_psdist.planning)
"""

from keras_psdist.cli.main import run

__all__ = ["run"]
