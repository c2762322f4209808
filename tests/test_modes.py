"""The execution modes: one registry, one spelling rule, one interface.

Every mode is registered once (`keras_psdist.modes.MODES`); every place that
reads a mode's name (`PSStrategy(mode=...)`, `modes.get`, `launch(mode=...)`,
`keras-psdist launch --mode`) reads it with the same rule
(`keras_psdist.cluster.mode_names`).
"""

import warnings

import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import cluster, modes
from keras_psdist.aggregators import Mean, Median
from keras_psdist.cluster import mode_names
from keras_psdist.cluster.config import LAUNCH_MODE_ENV
from keras_psdist.cluster.launcher.arguments import check_args
from keras_psdist.modes.sync_replicas import SyncReplicaAggregation
from keras_psdist.sync.staleness import BoundedStaleness
from keras_psdist.sync.training import SyncTraining

# Addresses nothing listens on: nothing below connects.
BETWEEN_GRAPH_JOBS = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}


def _launch_mode(mode):
    """`launch`'s reading of `mode` (its arguments, checked before anything
    starts)."""
    return check_args(["python"], 1, 1, mode, "127.0.0.1", None, 1.0)[1]


# ------------------------------------------------------------ the registry


def test_every_mode_is_registered_once_by_its_name():
    assert list(modes.MODES) == [
        "local",
        "in-graph",
        "between-graph",
        "bounded-staleness",
        "sync-replicas",
    ]
    for name, mode in modes.MODES.items():
        assert issubclass(mode, modes.Mode)
        assert mode.name == name
        assert mode.launch in (None, *mode_names.LAUNCH_MODES)
        assert mode.summary


def test_every_spelling_of_a_mode_reads_as_it():
    for name, mode in modes.MODES.items():
        assert mode.spellings()[0] == name
        for spelling in mode.spellings():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                assert modes.get(spelling) is mode
    assert modes.get(modes.LocalMode) is modes.LocalMode


def test_underscores_read_as_hyphens_everywhere(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert modes.get("sync_replicas") is modes.SyncReplicasMode
        assert _launch_mode("between_graph") == "between-graph"
        strategy = kpd.PSStrategy(mode="in_graph", devices=["/cpu:0"])
    assert strategy.extended.mode.name == "local"


def test_the_one_host_mode_names_no_mode_a_user_cannot_write(monkeypatch):
    # `mode="local"` is refused, so the one-host mode's messages and repr
    # must not suggest it.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = kpd.PSStrategy(devices=["/cpu:0"])
    assert repr(strategy.extended.mode) == "LocalMode(owner='PSStrategy on one host')"


@pytest.mark.parametrize(
    ("old", "new"), [("sync", "in-graph"), ("async", "between-graph")]
)
def test_the_old_spellings_warn_everywhere(old, new):
    said = f"mode={old!r} .* is now spelled mode={new!r}"
    with pytest.warns(DeprecationWarning, match=said):
        assert modes.get(old).name == new
    with pytest.warns(DeprecationWarning, match=said):
        assert _launch_mode(old) == new


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        modes.get("ring")
    assert str(e.value) == (
        "Unknown mode 'ring'. Expected one of: local, in-graph, between-graph, "
        "bounded-staleness, sync-replicas."
    )
    with pytest.raises(ValueError, match="Expected one of: in-graph, between-graph."):
        _launch_mode("sync-replicas")


def test_the_command_line_reads_the_same_words(monkeypatch):
    from keras_psdist.cli import main as cli

    assert cli.FLAGS["mode"].default == mode_names.IN_GRAPH
    for word in mode_names.LAUNCH_MODES:
        assert word in cli.FLAGS["mode"].help


# ------------------------------------------------------ choosing a mode


def _arguments(**kwargs):
    return modes.Arguments(**kwargs).checked()


def test_pick_the_mode_or_the_one_that_refines_it(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    worker = cluster.ClusterConfig(BETWEEN_GRAPH_JOBS, "worker", 0)
    chosen = {
        ("in-graph", None, None): modes.LocalMode,
        ("in-graph", worker, None): modes.InGraphMode,
        ("between-graph", worker, None): modes.BetweenGraphMode,
        ("between-graph", worker, 2): modes.BoundedStalenessMode,
        ("between-graph", None, 0): modes.BoundedStalenessMode,
    }
    for (name, config, staleness), mode in chosen.items():
        arguments = _arguments(cluster_resolver=config, max_staleness=staleness)
        assert type(modes.choose(name, arguments, "PSStrategy")) is mode


def test_max_staleness_needs_a_mode_that_bounds_it(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="Received: mode='in-graph', max_staleness=2"):
        modes.choose("in-graph", _arguments(max_staleness=2), "PSStrategy")


def test_a_new_mode_needs_only_its_registration(monkeypatch):
    """What adding a mode takes: its class and its line in `MODES`."""

    class Toy(modes.InGraphMode):
        name = "toy"
        summary = "a mode of this test"

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setitem(modes.MODES, "toy", Toy)
    assert modes.get("toy") is Toy
    assert type(modes.choose("toy", _arguments(), "PSStrategy")) is Toy
    with pytest.raises(ValueError, match="in-graph, between-graph, toy. .*toy: a mode"):
        modes.choose("ring", _arguments(), "PSStrategy")


# --------------------------------------------------------- the interface


def test_modes_that_keep_keras_step_add_no_training(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    mode = modes.choose("in-graph", _arguments(devices=["/cpu:0"]), "PSStrategy")
    assert mode.training(None, mode.topology(), None, None) is None


def test_one_host_runs_no_services_beside_keras_step(monkeypatch):
    """The extended asks the mode once for its services; one host has none:
    no watch, no heartbeats, no slots, no training; nothing to checkpoint,
    and an error while a variable is made passes as it is."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    extended = kpd.PSStrategy(devices=["/cpu:0"]).extended
    services = extended.services
    assert services == modes.services.ClusterServices(server_jobs=services.server_jobs)
    assert extended.sync_training is services.training is None
    assert extended.registry is None and services.checkpointed() == {}
    # The extended's attributes before 0.4 read the services.
    assert extended.heartbeats is extended.server_watch is None
    with pytest.raises(KeyError), services.reporting_lost_tasks():
        raise KeyError("not a lost task")


def test_the_services_give_what_the_extended_types(monkeypatch):
    """`ClusterServices` has every attribute and method of the
    `RunServices` Protocol the extended knows the services by."""
    from keras_psdist.distribute.run import RunServices

    fields = {
        f.name for f in modes.services.ClusterServices.__dataclass_fields__.values()
    }
    assert set(RunServices.__annotations__) <= fields
    for method in ("checkpointed", "reporting_lost_tasks"):
        assert callable(getattr(modes.services.ClusterServices, method))


def test_a_mode_s_training_reaches_the_services(monkeypatch):
    """The services hold what the mode's `training` hook made, and its state
    is what the extended checkpoints."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    state = tf.Module(name="toy_state")

    class Toy:
        def checkpointed(self):
            return {"toy": state}

    class ToyMode(modes.LocalMode):
        def training(self, strategy, topology, shared, heartbeats, registry=None):
            assert heartbeats is None and registry is None  # one host
            return Toy()

    monkeypatch.setattr(
        modes, "choose", lambda name, arguments, front: ToyMode(arguments, front)
    )
    extended = kpd.PSStrategy(devices=["/cpu:0"]).extended
    assert isinstance(extended.sync_training, Toy)
    assert extended.training_state.toy is state


@pytest.mark.parametrize("training", [SyncTraining, BoundedStaleness])
def test_the_trainings_declare_every_hook(training):
    hooks = [
        name
        for name in dir(modes.Training)
        if not name.startswith("_") and callable(getattr(modes.Training, name))
    ]
    assert "worker_apply" in hooks and "checkpointed" in hooks
    for hook in hooks:
        assert callable(getattr(training, hook, None)), hook


def test_the_sync_replica_rule_is_named_where_the_extended_receives_it(monkeypatch):
    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    worker = cluster.ClusterConfig(BETWEEN_GRAPH_JOBS, "worker", 1)
    arguments = _arguments(
        cluster_resolver=worker, aggregator="median", replicas_to_aggregate=1
    )
    mode = modes.SyncReplicasMode(arguments, "SyncReplicaStrategy")
    mode.validate()
    aggregation = mode.aggregation
    assert isinstance(aggregation, SyncReplicaAggregation)
    assert isinstance(aggregation.rule, Median)
    assert (aggregation.replicas_to_aggregate, aggregation.total_num_replicas) == (1, 2)
    assert repr(aggregation) == (
        f"SyncReplicaAggregation(rule={aggregation.rule!r}, "
        "replicas_to_aggregate=1, total_num_replicas=2, worker_momentum=0.0)"
    )
    # In the worker, its step is the mean's: the worker's replicas summed.
    grads = [[tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]]
    ours = aggregation.step(tf.distribute.ReduceOp.SUM, grads).values[0]
    mean = Mean().step(tf.distribute.ReduceOp.SUM, grads).values[0]
    assert ours.numpy().tolist() == mean.numpy().tolist() == [4.0, 6.0]


def test_sync_replicas_check_the_rule_before_connecting(monkeypatch):
    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    worker = cluster.ClusterConfig(BETWEEN_GRAPH_JOBS, "worker", 0)
    arguments = _arguments(cluster_resolver=worker, aggregator="krum", num_byzantine=1)
    with pytest.raises(ValueError, match="Krum"):
        modes.SyncReplicasMode(arguments, "SyncReplicaStrategy").validate()
