"""The planner (`keras_psdist.plan`, `keras-psdist plan`): its predictions
move the way the costs say they must, it names the bottleneck of
constructed cases, it recommends the fewest sufficient ps tasks, and it
refuses bad input with what it received. Pure Python: no process starts."""

import json
import math

import keras
import pytest

from keras_psdist.cli import main as cli
from keras_psdist.planning import Costs, Plan, plan
from keras_psdist.planning.model import (
    MODES,
    Setup,
    ps_share,
    ps_tensors,
    ps_variables,
)

pytestmark = pytest.mark.timeout(60)

# The MLP of benchmarks/scaling.py, 64-512-512-2, float32.
MLP = [4 * n for n in (64 * 512, 512, 512 * 512, 512, 512 * 2, 2)]
EQUAL = [1_000_000] * 8


def _one(mode="between-graph", **kwargs):
    """The single prediction of one mode, compression and ps count."""
    kwargs.setdefault("variable_bytes", MLP)
    kwargs.setdefault("num_ps", 1)
    [prediction] = plan(modes=(mode,), **kwargs).predictions
    return prediction


@pytest.mark.parametrize("mode", MODES)
def test_a_faster_link_never_predicts_less(mode):
    rates = [0.5, 1, 10, 100, 1_000, 10_000, None]
    speeds = [_one(mode, workers=4, link_mbit=r).examples_per_s for r in rates]
    assert speeds == sorted(speeds)


@pytest.mark.parametrize("mode", MODES)
def test_twice_the_bytes_on_a_link_bound_config_halve_the_updates(mode):
    small = _one(mode, variable_bytes=EQUAL, workers=4, link_mbit=1, step_ms=1)
    large = _one(
        mode, variable_bytes=[2 * b for b in EQUAL], workers=4, link_mbit=1, step_ms=1
    )
    assert small.bottleneck == large.bottleneck == "ps link"
    assert large.updates_per_s / small.updates_per_s == pytest.approx(0.5, rel=0.01)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "sizes, partitioned", [(EQUAL, False), ([8_000_000], True)], ids=["whole", "split"]
)
def test_more_ps_tasks_lower_each_tasks_cpu_and_bytes(mode, sizes, partitioned):
    rows = [
        _one(mode, variable_bytes=sizes, workers=4, num_ps=n, partitioned=partitioned)
        for n in (1, 2, 4, 8)
    ]
    cpu = [p.ps_cpu_ms_per_update for p in rows]
    link = [p.ps_link_mb_per_update for p in rows]
    assert cpu == sorted(cpu, reverse=True) and len(set(cpu)) == 4
    assert link == sorted(link, reverse=True) and len(set(link)) == 4


def test_whole_variables_go_as_greedy_placement_puts_them():
    # The 1 MB kernel stays whole: a second ps task takes only the rest.
    share, used = ps_share(MLP, 2, partitioned=False)
    assert share == pytest.approx((MLP[1] + MLP[2]) / sum(MLP))
    assert used == 2
    assert ps_share(MLP, 8, partitioned=False)[1] == 6  # one task per variable


@pytest.mark.parametrize("mode", MODES)
def test_small_variables_travel_packed_large_ones_alone(mode):
    # A task's variables of at most 256 KiB are read as one tensor and their
    # gradients pushed as one (sync replicas push one per variable); each
    # larger variable is a read and a push of its own (ps_request_cost.py).
    costs = Costs(ps_apply_ms_per_variable=0)  # the transfers' count alone
    large = _one(mode, variable_bytes=[8_000_000] * 2, workers=4, costs=costs)
    small = _one(mode, variable_bytes=[100_000] * 160, workers=4, costs=costs)
    steps = 1 if mode == "between-graph" else 4
    tensors = 1 + (160 if mode == "sync-replicas" else 1)
    extra = steps * (tensors - 4) * costs.ps_tensor_ms
    assert small.ps_cpu_ms_per_update - large.ps_cpu_ms_per_update == pytest.approx(
        extra
    )


def test_the_transfers_a_step_makes_to_each_ps_task():
    # Reads: the 1 MiB kernel alone and the other 5 as one; 6 pushes (sync).
    busiest, total = ps_tensors(MLP, 1, partitioned=False, packed_pushes=False)
    assert busiest == total == 8
    assert ps_tensors(MLP, 1, partitioned=False) == (4, 4)
    # Partitioned, every task holds a shard of each variable.
    assert ps_tensors(MLP, 4, partitioned=True) == (12, 48)


@pytest.mark.parametrize("mode", MODES)
def test_a_tiny_link_is_the_ps_link(mode):
    assert _one(mode, workers=4, link_mbit=0.01).bottleneck == "ps link"


def test_one_async_worker_on_a_tiny_link_waits_on_its_own_link():
    assert _one(workers=1, link_mbit=0.01).bottleneck == "worker link"


@pytest.mark.parametrize("mode", MODES)
def test_a_huge_step_is_worker_compute(mode):
    assert _one(mode, workers=4, step_ms=1e6).bottleneck == "worker compute"


@pytest.mark.parametrize("mode", MODES)
def test_few_shared_cores_are_the_shared_cores(mode):
    # Each task alone would be fast; 0.01 cores shared by all are not.
    result = _one(mode, workers=4, cores_per_task=8, machine_cores=0.01)
    assert result.bottleneck == "shared cores"


def test_the_shared_cores_cap_scales_with_the_share_the_tasks_keep_busy():
    # Bound by the shared cores, the updates go as the share of them in use.
    full, most = (
        _one(workers=4, machine_cores=0.01, costs=Costs(shared_core_use=use))
        for use in (1.0, 0.8)
    )
    assert full.bottleneck == most.bottleneck == "shared cores"
    assert most.updates_per_s / full.updates_per_s == pytest.approx(0.8)


def test_a_sync_update_on_shared_cores_adds_its_barrier_to_their_time():
    # No worker computes while a sync update is released: on shared cores
    # the critical path adds to the cores' time; async has no barrier.
    def period_ms(mode, critical):
        costs = Costs(sync_critical_path_ms=critical)
        result = _one(mode, workers=4, machine_cores=0.05, costs=costs)
        assert result.bottleneck == "shared cores"
        return 1000 / result.updates_per_s

    assert period_ms("sync-replicas", 50) - period_ms("sync-replicas", 0) == (
        pytest.approx(50)
    )
    assert period_ms("between-graph", 50) == pytest.approx(
        period_ms("between-graph", 0)
    )


@pytest.mark.parametrize("mode", MODES)
def test_each_variable_costs_the_ps_its_optimizer_ops(mode):
    # The same bytes in 6 or in 48 variables (their transfers' count costs
    # nothing here): the ps pays the optimizer's ops once more per variable.
    few, many = [240_000] * 6, [30_000] * 48
    costs = Costs(ps_apply_ms_per_variable=0.05, ps_tensor_ms=0)
    cpu = [
        _one(mode, variable_bytes=sizes, workers=2, costs=costs).ps_cpu_ms_per_update
        for sizes in (few, many)
    ]
    assert cpu[1] - cpu[0] == pytest.approx(42 * 0.05)
    assert ps_variables(many, 4, partitioned=False) == (12, 48)
    assert ps_variables(many, 4, partitioned=True) == (48, 192)


def test_the_critical_paths_are_named():
    quick = dict(workers=8, step_ms=0.01, costs=Costs(sync_critical_path_ms=1e4))
    assert _one("sync-replicas", **quick).bottleneck == "sync critical path"
    assert _one("in-graph", workers=64, step_ms=0.01).bottleneck == (
        "in-graph critical path"
    )


def test_sync_examples_grow_with_the_workers_when_compute_bound():
    base = _one("sync-replicas", workers=1, step_ms=10_000).examples_per_s
    for workers in (2, 4, 8, 16):
        speed = _one("sync-replicas", workers=workers, step_ms=10_000).examples_per_s
        assert speed / base == pytest.approx(workers, rel=0.02)


def test_an_async_update_is_one_step_a_sync_update_all_workers():
    async_, sync = (
        _one(m, workers=4, step_ms=1e6) for m in ("between-graph", "sync-replicas")
    )
    assert async_.examples_per_s == pytest.approx(async_.updates_per_s * 128)
    assert sync.examples_per_s == pytest.approx(sync.updates_per_s * 4 * 128)


@pytest.mark.parametrize(
    "config",
    [
        dict(variable_bytes=[4_000_000] * 4, workers=8, link_mbit=100),
        dict(variable_bytes=[8_000_000], workers=64, link_mbit=10_000,
             cores_per_task=8, partitioned=True),
        dict(variable_bytes=MLP, workers=16),
    ],
    ids=["link", "many-workers", "mlp"],
)  # fmt: skip
def test_the_recommendation_is_the_fewest_ps_tasks_within_5_percent(config):
    result = plan(**config)
    for mode, pick in result.by_mode.items():
        rows = [p for p in result.predictions if p.mode == mode]
        best = max(p.examples_per_s for p in rows)
        assert pick.examples_per_s >= 0.95 * best
        assert all(
            p.examples_per_s < 0.95 * best for p in rows if p.num_ps < pick.num_ps
        )
    assert result.recommendation.mode == "between-graph"
    assert result.recommendation.num_ps == result.by_mode["between-graph"].num_ps


def test_four_equal_variables_on_a_slow_link_want_four_ps_tasks():
    result = plan(variable_bytes=[4_000_000] * 4, workers=8, link_mbit=100)
    assert result.recommendation.num_ps == 4
    assert max(p.num_ps for p in result.predictions) == 8
    many = plan(variable_bytes=MLP, workers=64)
    assert max(p.num_ps for p in many.predictions) == 64


def test_exact_recommends_the_faster_of_sync_and_in_graph():
    result = plan(variable_bytes=MLP, workers=8, exact=True)
    sync, in_graph = result.by_mode["sync-replicas"], result.by_mode["in-graph"]
    faster = (
        "sync-replicas" if sync.examples_per_s > in_graph.examples_per_s else "in-graph"
    )
    assert result.recommendation.mode == faster


def test_the_first_compression_listed_wins_within_5_percent():
    both = ("none", "top_k(ratio=0.01)@bfloat16")
    # Bound by a long step, the two are within 5 %: the first listed wins.
    fast = plan(variable_bytes=MLP, workers=4, num_ps=1, compressions=both,
                step_ms=1_000)  # fmt: skip
    slow = plan(variable_bytes=MLP, workers=4, num_ps=1, compressions=both,
                link_mbit=10)  # fmt: skip
    assert fast.recommendation.compression == "none"
    assert slow.recommendation.compression == both[1]


def test_costs_refuse_a_negative_constant():
    with pytest.raises(ValueError, match="Received: rtt_ms=-1"):
        Costs(rtt_ms=-1)
    with pytest.raises(ValueError, match="> 0. Received: shared_core_use=0"):
        Costs(shared_core_use=0)


@pytest.mark.parametrize(
    "compression, read, gradient",
    [
        ("none", 1, 1),
        ("fp16", 1, 0.5),
        ("bfloat16", 1, 0.5),
        ("top_k(ratio=0.01)", 1, 0.02),
        ("none@bfloat16", 0.5, 1),
        ("top_k(ratio=0.05)@bfloat16", 0.5, 0.1),
    ],
)
def test_compression_shrinks_the_bytes_through_the_ps_link(compression, read, gradient):
    prediction = _one(variable_bytes=EQUAL, workers=2, compressions=(compression,))
    assert prediction.ps_link_mb_per_update == pytest.approx(8 * (read + gradient))


def _tiny_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)]
    )


def _same(a: Plan, b: Plan) -> None:
    assert a.predictions == b.predictions
    assert a.recommendation == b.recommendation


def test_a_model_plans_as_its_variable_bytes():
    sizes = [8 * 4 * 4, 4 * 4, 4 * 2 * 4, 2 * 4]
    _same(plan(_tiny_model(), workers=4), plan(variable_bytes=sizes, workers=4))


def test_a_keras_file_plans_as_its_model(tmp_path):
    path = tmp_path / "tiny.keras"
    _tiny_model().save(path)
    _same(plan(str(path), workers=4), plan(_tiny_model(), workers=4))


def test_the_plan_is_labelled_a_prediction_in_text_and_json():
    result = plan(variable_bytes=MLP, workers=4, compressions=("none", "fp16"))
    text = str(result)
    assert "not measured" in text and "Recommendation (predicted)" in text
    assert text.count("| between-graph |") == 16  # 2 compressions x 8 ps counts
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["label"] == "prediction"
    assert {p["label"] for p in payload["predictions"]} == {"prediction"}
    assert payload["recommendation"]["mode"] == "between-graph"


def _cli(*args: str) -> int:
    try:
        return cli._main(cli._parse_flags(["keras-psdist", *args]))
    finally:
        cli.FLAGS.unparse_flags()


def test_the_cli_prints_the_table_and_exits_0(capsys):
    sizes = ",".join(map(str, MLP))
    assert _cli("plan", f"--variable-bytes={sizes}", "--workers=4") == 0
    out = capsys.readouterr().out
    assert "| mode | ps tasks | predicted updates/s" in out
    assert "Recommendation (predicted): between-graph" in out


def test_the_cli_says_a_bad_flag_in_flag_words(capsys):
    assert _cli("plan", "--variable-bytes=4096", "--workers=0") == 2
    assert "`--workers` must be >= 1. Received: --workers=0" in capsys.readouterr().err


def test_a_plan_beyond_the_validated_workers_says_it_extrapolates():
    near, far = (str(plan(variable_bytes=MLP, workers=w)) for w in (8, 9))
    assert "extrapolate" not in near
    assert "at most 8 workers" in far and "at 9 these figures extrapolate" in far


def test_a_flag_given_with_units_says_to_give_a_number(capsys):
    with pytest.raises(SystemExit) as exited:
        _cli("plan", "--variable-bytes=4096", "--workers=2", "--link-mbit=1Gbit")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--link-mbit=1Gbit" in err and "give a number, without units" in err


def test_plan_help_says_it_tries_several_ps_counts(capsys):
    with pytest.raises(SystemExit):
        _cli("plan", "--help")
    line = next(x for x in capsys.readouterr().out.splitlines() if "--num-ps" in x)
    assert "(default: 1 to 8 tried" in line


@pytest.mark.parametrize(
    "kwargs, received",
    [
        (dict(variable_bytes=MLP, workers=0), "workers=0"),
        (dict(model=_tiny_model, variable_bytes=MLP, workers=2), "Received: both"),
        (dict(workers=2), "Received: neither"),
        (dict(variable_bytes=MLP, workers=2, modes=("between-graph", "asink")), "'asink'"),
        (dict(variable_bytes=MLP, workers=2, compressions=("topk",)), "'topk'"),
        (dict(variable_bytes=MLP, workers=2, compressions=("random_k",)), "random_k"),
        (dict(variable_bytes=MLP, workers=2, num_ps=0), "num_ps=0"),
        (dict(variable_bytes=MLP, workers=2, link_mbit=0), "link_mbit=0"),
        (dict(variable_bytes=MLP, workers=2, link_mbit=math.nan), "link_mbit=nan"),
        (dict(variable_bytes=[], workers=2), "variable_bytes=[]"),
        (dict(variable_bytes=[1, -4], workers=2), "variable_bytes[i]=-4"),
        (dict(model="model.h5", workers=2), "model='model.h5'"),
        (dict(variable_bytes=MLP, workers=2, modes=("between-graph",), exact=True),
         "modes=('between-graph',)"),
    ],
)  # fmt: skip
def test_bad_input_raises_value_error_naming_what_it_received(kwargs, received):
    if callable(kwargs.get("model")):
        kwargs = dict(kwargs, model=kwargs["model"]())
    with pytest.raises(ValueError, match="Received") as raised:
        plan(**kwargs)
    assert received in str(raised.value)


@pytest.mark.parametrize(
    "old, new", [("sync", "sync-replicas"), ("async", "between-graph")]
)
def test_a_mode_is_named_as_the_strategy_names_it(old, new):
    # Before 0.2 `PSStrategy(mode="sync")` meant in-graph: the planner does
    # not guess, it names the mode that means the training the word says.
    with pytest.raises(ValueError, match=f"For {old} training, write '{new}'"):
        plan(variable_bytes=MLP, workers=2, modes=(old,))
    spelt = plan(variable_bytes=MLP, workers=2, modes=(new.replace("-", "_"),))
    assert {p.mode for p in spelt.predictions} == {new}


def test_setup_defaults_predict_without_plan():
    # The model's functions stand alone (plan_check.py calls them too).
    from keras_psdist.planning import model, wire

    setup = Setup(tuple(MLP), workers=2, num_ps=1)
    prediction = model.predict("sync-replicas", wire.parse("none"), setup, Costs())
    assert prediction.updates_per_s > 0 and prediction.label == "prediction"


def test_planning_imports_no_tensorflow():
    # A laptop plans a cluster without TensorFlow's import (docs/architecture.md).
    import subprocess
    import sys

    code = (
        "import sys; from keras_psdist import planning; "
        "planning.plan(variable_bytes=[4096, 64], workers=8); "
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


READS_TOO = "top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)"


def test_the_recommendation_says_the_strategy_to_write_and_the_launch():
    import shlex

    import keras_psdist as kpd

    result = plan(
        variable_bytes=MLP,
        workers=2,
        modes=("in-graph",),
        compressions=(READS_TOO,),
        exact=True,
    )
    rec = result.recommendation
    assert rec.strategy == (
        'kpd.PSStrategy(compression="top_k(ratio=0.01)", read_dtype="bfloat16", '
        'read_compression="top_k(ratio=0.05)")'
    )
    # The code builds (in-graph, this process's devices) what the plan assumed.
    strategy = eval(rec.strategy, {"kpd": kpd})  # noqa: S307
    assert isinstance(strategy, kpd.PSStrategy)
    assert rec.launch == (
        f"keras-psdist launch --num-ps {rec.num_ps} --num-workers 2 -- python train.py"
    )
    try:  # every flag of the command is one `keras-psdist launch` takes
        assert cli._parse_flags(shlex.split(rec.launch))[1] == "launch"
        assert cli.FLAGS.num_ps == rec.num_ps and cli.FLAGS.num_workers == 2
    finally:
        cli.FLAGS.unparse_flags()
    assert "To run it: `kpd.PSStrategy(" in str(result)
    assert result.to_dict()["recommendation"]["launch"] == rec.launch


@pytest.mark.parametrize(
    "mode, strategy, flag",
    [
        ("between-graph", 'kpd.PSStrategy(mode="between-graph", compression="fp16")', True),
        ("sync-replicas", 'kpd.SyncReplicaStrategy(compression="fp16")', True),
        ("in-graph", 'kpd.PSStrategy(compression="fp16")', False),
    ],
)  # fmt: skip
def test_each_mode_names_its_strategy_and_launch_mode(mode, strategy, flag):
    rec = plan(
        variable_bytes=MLP, workers=4, modes=(mode,), compressions=("fp16",)
    ).recommendation
    assert rec.strategy == strategy
    assert ("--mode between-graph" in rec.launch) == flag


def test_a_partitioned_plan_writes_its_partitioner():
    rec = plan(
        variable_bytes=[64_000_000], workers=32, link_mbit=1000, partitioned=True
    ).recommendation
    assert rec.num_ps > 1
    assert f"partitioner=kpd.partitioners.Fixed({rec.num_ps})" in rec.strategy
