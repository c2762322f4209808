"""A training process that is killed in the middle of writing a checkpoint.

Run by `tests/test_faults.py`:

    python checkpoint_kill_job.py OUT_DIR

Trains the digits MLP under a one-host `PSStrategy` (2 logical CPU replicas)
with `ModelCheckpoint(OUT_DIR/ckpt.weights.h5, save_weights_only=True)` at
every epoch end, and records the weights after each epoch's checkpoint in
`OUT_DIR/epoch_<e>.npz`. The second checkpoint write is made slow: after its
first variable it writes `OUT_DIR/writing` and sleeps, for the test to
SIGKILL the process there.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.src.saving import saving_lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster_jobs"))
import digits_job  # noqa: E402


class RecordWeights(keras.callbacks.Callback):
    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = out_dir

    def on_epoch_end(self, epoch, logs=None):
        np.savez(
            os.path.join(self.out_dir, f"epoch_{epoch}.npz"),
            *[w.numpy() for w in self.model.weights],
        )


def slow_second_write(out_dir):
    saves = {"count": 0}
    save_weights_only = saving_lib.save_weights_only
    setitem = saving_lib.H5IOStore.__setitem__

    def counting(*args, **kwargs):
        saves["count"] += 1
        return save_weights_only(*args, **kwargs)

    def slow(self, key, value):
        setitem(self, key, value)
        marker = os.path.join(out_dir, "writing")
        if saves["count"] == 2 and not os.path.exists(marker):
            self.h5_file.flush()
            open(marker, "w").close()
            time.sleep(300)

    saving_lib.save_weights_only = counting
    saving_lib.H5IOStore.__setitem__ = slow


def main(out_dir):
    import keras_psdist as kpd
    from keras_psdist.devices import split_host_cpu

    split_host_cpu(2)

    strategy = kpd.PSStrategy()
    model = digits_job.build(strategy)
    slow_second_write(out_dir)
    x, y = digits_job.digits()
    checkpoint = keras.callbacks.ModelCheckpoint(
        os.path.join(out_dir, "ckpt.weights.h5"), save_weights_only=True
    )
    model.fit(
        x[:600],
        y[:600],
        batch_size=60,
        epochs=3,
        verbose=0,
        callbacks=[checkpoint, RecordWeights(out_dir)],
    )


if __name__ == "__main__":
    main(sys.argv[1])
