"""The Keras layer: every place keras_psdist reaches into Keras.

    keras_patches.py   every Keras method keras_psdist wraps (`PATCHES`, each
                       with what Keras lacks), installed together when the
                       first strategy is built, reversible; the one module
                       that names Keras's private modules
    checkpointing.py   the wrappers that make checkpoints chief-only and atomic
    compile_checks.py  the wrappers that refuse `compile` and `fit` mistakes
                       (a piece made outside the scope) with the fix
    xla.py             `jit_compile=True`: each replica's forward and backward
                       pass compiled on its device, the update outside XLA
    step_device.py     the wrapper that calls Keras's train and test functions
                       on the first worker in-graph, not on the chief
    routed_take.py     the wrapper that gathers an embedding's rows where
                       they live instead of reading the whole table
    one_device_steps.py  the wrappers that run as one device does a model
                       built in its traced step and a loss computed outside
                       `strategy.run`
    training_hooks.py  the wrappers that hand the optimizer's apply and `fit`
                       to the mode's `Training` (sync replicas, bounded
                       staleness)

Beside it, `keras_psdist/_tf.py` holds every import of TensorFlow's private
modules and checks the supported TensorFlow and Keras versions on import.
`tests/test_keras_integration.py` holds both to that.
"""
