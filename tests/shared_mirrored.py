"""One `MirroredStrategy` per test process, shared by every test module.

Every instance numbers its collective ops from the same keys, so a second
instance's all-reduces collide with the first's ("Shape mismatch in the
collective instance 100", then "Collective ops is aborted ... Restart your
program to reset" for every later step in the process;
tensorflow/tensorflow#62790). Under pytest-xdist two modules that each kept
their own instance met in one worker process.
"""

from __future__ import annotations

import functools

import tensorflow as tf


@functools.cache
def mirrored_strategy(devices: tuple[str, ...]) -> tf.distribute.Strategy:
    """The process's `MirroredStrategy` over `devices`."""
    return tf.distribute.MirroredStrategy(devices=list(devices))
