"""Where the sync protocol's control flow gets its inputs (one process, two
logical CPUs standing for a worker and a ps task).

TensorFlow lowers a `cond` to a `Switch` per input and a `while_loop` to an
`Enter` per input, each placed beside its input, not where the branch runs
(`lower_if_op.cc`). A branch on the ps whose input was read on the worker
therefore sends the predicate to the worker and the value back: a round trip
per nesting level, on every step's critical path. These tests hold that
every input of the protocol's control flow on the ps is made on the ps,
except the gradients themselves (an ended step must not send them).
"""

import tensorflow as tf

from keras_psdist.sync.protocol import SyncConfig, SyncReplicas

WORKER = "/job:localhost/replica:0/task:0/device:CPU:0"
PS = "/job:localhost/replica:0/task:0/device:CPU:1"
CONTROL_FLOW = {"If", "StatelessIf", "While", "StatelessWhile"}


class _Shared:
    """`SharedVariables` for one process: plain variables on the device."""

    def create_int64(self, device, name, initial_value):
        with tf.init_scope(), tf.device(device):
            return tf.Variable(tf.constant(initial_value, tf.int64), trainable=False)


def _same_device(a: str, b: str) -> bool:
    return tf.DeviceSpec.from_string(a) == tf.DeviceSpec.from_string(b)


def _control_flow_inputs(graph, gradient_ops):
    """`(op, input op)` for every control-flow op on the ps, nested branch
    and loop bodies included, whose input is made elsewhere."""
    found = []

    def visit(g):
        for op in g.get_operations():
            if op.type not in CONTROL_FLOW:
                continue
            if _same_device(op.device, PS):
                for tensor in op.inputs:
                    source = tensor.op
                    if source.name in gradient_ops:
                        continue
                    if not _same_device(source.device, PS):
                        found.append((op.name, source.name, source.device))
            for attr in ("then_branch", "else_branch", "cond", "body"):
                try:
                    function = op.get_attr(attr)
                except ValueError:
                    continue
                body = g._get_function(function.name)  # noqa: SLF001
                if body is not None:
                    visit(body.graph)

    visit(graph)
    return found


def test_the_worker_step_s_control_flow_takes_its_inputs_on_the_ps():
    tf.config.set_soft_device_placement(False)
    sync = SyncReplicas(
        SyncConfig(1, 1, 60.0),
        worker=0,
        is_chief=True,
        device=PS,
        shared=_Shared(),
        local_device=WORKER,
    )
    with tf.device(WORKER):
        variables = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([2]))]

    @tf.function
    def step():
        with tf.device(WORKER):
            grads = [tf.ones([3, 2]), tf.ones([2])]
        step.gradient_ops = {g.op.name for g in grads}
        sync.worker_step(grads, variables)

    graph = step.get_concrete_function().graph
    assert any(op.type in CONTROL_FLOW for op in graph.get_operations())
    assert _control_flow_inputs(graph, step.gradient_ops) == []
