"""The `keras-psdist` command: `demo`, `launch`, `serve`.

main.py  the argument parser and the commands
demo.py  `keras-psdist demo`: digits on logical CPU replicas
"""

from keras_psdist.cli.main import run

__all__ = ["run"]
