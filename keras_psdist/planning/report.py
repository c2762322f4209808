"""A plan as text: the markdown table `str(plan)` prints, marked as
predictions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from keras_psdist.planning.model import Prediction

# The most workers of the runs the constants were fitted and validated on.
VALIDATED_WORKERS = 8


def render(
    predictions: Sequence[Prediction],
    by_mode: Mapping[str, Prediction],
    recommendation: Any,
    given: Mapping[str, Any],
) -> str:
    """A plan as markdown: what was predicted (`given`: `Plan.inputs`), the
    table, each mode's pick (`by_mode`, starred) and the recommendation."""
    compressions = sorted({p.compression for p in predictions})
    link, cores = given["link_mbit"], given["cores_per_task"]
    lines = [
        "Predicted by keras_psdist's cost model (not measured): "
        f"{given['workers']} workers, "
        f"{'unlimited links' if link is None else f'{link:g} Mbit/s links'}, "
        f"{cores:g} core{'' if cores == 1 else 's'} per task, batch {given['batch']}, "
        f"{given['params']:,} parameters ({given['variable_mb']:.2f} MB), "
        f"step {given['step_ms']:.3g} ms on one core"
        + ("" if given["step_ms_given"] else " (estimated)")
        + ("" if len(compressions) > 1 else f", compression {compressions[0]}")
        + (
            f", {given['machine_cores']:g} cores shared by every task"
            if given["machine_cores"]
            else ""
        )
        + ".",
        "",
    ]
    if given["workers"] > VALIDATED_WORKERS:
        lines += [
            f"The constants were measured with at most {VALIDATED_WORKERS} "
            'workers on one 2-core machine (docs/planning.md, "Validated"): '
            f"at {given['workers']} these figures extrapolate.",
            "",
        ]
    columns = ["mode", "compression", "ps tasks", "predicted updates/s",
               "predicted examples/s", "bottleneck", "ps CPU ms/update",
               "ps link MB/update", ""]  # fmt: skip
    if len(compressions) == 1:
        columns.remove("compression")
    lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    picked = {id(p) for p in by_mode.values()}
    for p in predictions:
        cells = [p.mode, p.compression, str(p.num_ps), f"{p.updates_per_s:,.1f}",
                 f"{p.examples_per_s:,.0f}", p.bottleneck,
                 f"{p.ps_cpu_ms_per_update:.2f}", f"{p.ps_link_mb_per_update:.2f}",
                 "*" if id(p) in picked else ""]  # fmt: skip
        if len(compressions) == 1:
            del cells[1]
        lines.append("| " + " | ".join(cells) + " |")
    rec = recommendation
    lines += [
        "",
        "\\* each mode's pick: the fewest ps tasks within 5 % of its best"
        + (", with the first compression listed." if len(compressions) > 1 else "."),
        "",
        f"Recommendation (predicted): {rec.mode}, {rec.num_ps} ps "
        f"task{'s' if rec.num_ps > 1 else ''}, compression {rec.compression}. "
        f"{rec.why}",
        "",
        f"To run it: `{rec.strategy}` in train.py, started with `{rec.launch}` "
        "(on separate machines, each task's TF_CONFIG names the same tasks: "
        "docs/cluster.md).",
    ]
    return "\n".join(lines)
