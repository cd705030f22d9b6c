"""Decision records and the stories told from them.

:func:`build_record` turns one epoch's stages into the JSON-able decision record
(inputs, predictions, demand by reason, the DP result, what was cut and why,
the node recommendation). It goes to SQLite, `dschedctl plan` and /metrics.
:func:`explain_lines` tells one application's story over the last epochs for
`dschedctl explain APP`.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from controller.stages.columns import values_in_order
from controller.stages.feedback import app_latencies_ms

if TYPE_CHECKING:
    from controller.epoch import EpochResult


# The last record and its JSON: the store writes it and GetPlan answers with it,
# and at 20,000 instances one encoding is 10 MB.
_encoded: tuple[dict | None, str] = (None, "")


def record_json(record: dict[str, Any]) -> str:
    """The decision record as JSON text, encoded once however many ask for it.

    orjson rather than the standard library's encoder: at a 1,000-node cluster
    the record is megabytes of JSON, encoded twice an epoch while it holds the
    interpreter against the agents' streams, and the standard library's encoder
    takes several times as long. Numbers it cannot represent (NaN, infinities)
    become ``null``, as JSON has no token for them; a record is built with None
    there already.
    """
    global _encoded
    last, text = _encoded
    if last is not record:
        text = orjson.dumps(
            record, default=float, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        ).decode()
        _encoded = (record, text)
    return text


def _ms(seconds: float | None) -> float | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return 1000.0 * seconds


def _per_view(ops: list, field: str, default: Any) -> list:
    """One per-instance field of the views, in row order (``default`` where missing)."""
    return list(
        chain.from_iterable(
            map(getattr(v, field).get, v.instances, repeat(default)) for _, v in ops
        )
    )


def _variability_row(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    return {
        "arrival_scv": v.arrival_scv,
        "service_scv": v.service_scv,
        "arrival_scv_source": v.arrival_source,
        "service_scv_source": v.service_source,
    }


def build_record(
    result: EpochResult,
    *,
    mode: str,
    slot_seconds: float,
    placement: dict[str, Any],
    actuator: str,
    acted: Any,
    rejected: dict[str, int],
    node_pool_action: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of ``result`` with what the edges did with it."""
    epoch, now = result.epoch, result.now
    views, forecasts, demands = result.views, result.forecasts, result.demands
    alloc, steps, classes, budgets = result.alloc, result.steps, result.classes, result.budgets
    estimates, predicted_violation = result.estimates, result.predicted_violation
    capacity, room, peaks = result.capacity, result.room, result.peaks
    # End-to-end latency is reported where root tuples complete (sinks).
    measured = {app: lat for app, (lat, _end) in app_latencies_ms(views).items()}
    ops = list(views.items())
    # One row per instance, views in key order and their instances in order.
    # Columns are gathered with C-level maps and the rows built from them in
    # one pass: at 20,000 instances a lookup-per-field loop cost more than
    # the decisions it recorded.
    counts = [len(v.instances) for _, v in ops]
    keys = [k for _, v in ops for k in v.instances]
    n = len(keys)
    if n:
        apps, names, indices = zip(*keys, strict=True)
        _, nodes, demand, reason, backlog = zip(*values_in_order(demands, keys), strict=True)
        cap, _, hysteresis, _ = zip(*values_in_order(steps, keys), strict=True)
    else:
        apps = names = indices = nodes = demand = reason = backlog = cap = hysteresis = ()
    allocated = values_in_order(alloc.cores, keys)
    cut = list(map(alloc.cut.get, keys, repeat(0.0)))
    usage = _per_view(ops, "usage_by_instance", 0.0)
    in_force = _per_view(ops, "cap_by_instance", None)
    throttled = _per_view(ops, "throttled_by_instance", None)
    queue = _per_view(ops, "queue_by_instance", 0.0)
    share = _per_view(ops, "share_by_instance", None)
    instances = [
        {
            "app": a,
            "operator": o,
            "instance": i,
            "node": nd,
            "demand_cores": dc,
            "demand_reason": dr,
            "backlog_cores": bl,
            "allocated_cores": al,
            "cut_cores": cu,
            "cap_cores": cp,
            "hysteresis": hy,
            "usage_cores": us,
            "cap_in_force": cf,
            "throttled_seconds": th,
            "queue": q,
            "arrival_share": sh,
        }
        for a, o, i, nd, dc, dr, bl, al, cu, cp, hy, us, cf, th, q, sh in zip(
            apps,
            names,
            indices,
            nodes,
            demand,
            reason,
            backlog,
            allocated,
            cut,
            cap,
            hysteresis,
            usage,
            in_force,
            throttled,
            queue,
            share,
            strict=True,
        )
    ]
    if peaks:
        for k, row in zip(keys, instances, strict=True):
            if k in peaks:
                row["peak_demand_cores"] = peaks[k]
    placed = result.placement_demands
    if placed:
        for k, row in zip(keys, instances, strict=True):
            if k in placed:
                row["placement_demand_cores"] = placed[k]
    cuts = [
        {
            "app": apps[j],
            "operator": names[j],
            "instance": indices[j],
            "node": nodes[j],
            "cut_cores": cut[j],
            "reason": alloc.cut_reason.get(keys[j], ""),
        }
        for j in np.flatnonzero(np.asarray(cut, dtype=float) > 1e-9).tolist()
    ]
    # Sums in instance order, as a sum over each operator's (or app's) rows would add.
    op_of = np.repeat(np.arange(len(ops)), counts)
    op_demand = np.bincount(op_of, weights=demand, minlength=len(ops)).tolist()
    op_cap = np.bincount(op_of, weights=cap, minlength=len(ops)).tolist()
    app_ix: dict[str, int] = {}
    for op, _ in ops:
        app_ix.setdefault(op.app, len(app_ix))
    app_of = np.repeat([app_ix[op.app] for op, _ in ops], counts).astype(int)
    app_cap = np.bincount(app_of, weights=cap, minlength=len(app_ix)).tolist()
    caps_by_app = {a: app_cap[i] for a, i in app_ix.items()}
    operators = []
    start = 0
    for o, (op, v) in enumerate(ops):
        fc = forecasts[op]
        end = start + counts[o]
        operators.append(
            {
                "app": op.app,
                "operator": op.operator,
                "instances": counts[o],
                "arrival_rate": float(v.arrivals[-1]) if len(v.arrivals) else 0.0,
                "predicted_rate": fc.rate,
                "predictor": fc.predictor,
                "candidates": fc.candidates,
                "kappa": fc.kappa,
                "selectivity": v.selectivity if fc.selectivity is None else fc.selectivity,
                "demand_cores": op_demand[o] if counts[o] else 0,
                "cap_cores": op_cap[o] if counts[o] else 0,
                "usage_cores": v.usage_cores,
                "queue": float(v.queue[-1]) if len(v.queue) else 0.0,
                "latency_ms": v.latency_ms,
                "service_ms": v.service_ms,
                "latency_budget_ms": _ms(budgets.get(op)),
                "reason": ", ".join(sorted(set(reason[start:end]))),
            }
        )
        start = end
    held = []
    for k, u in sorted(result.held.items()):
        step = steps.get(k)
        held.append(
            {
                "app": k.app,
                "operator": k.operator,
                "instance": k.instance,
                "node": u.node,
                "engine": u.engine,
                "cap_cores": step.cap if step is not None else None,  # None: uncapped
                "hysteresis": "held",
                "reason": u.reason,
            }
        )
    held_notes = [
        f"held {n} instance(s) at their caps: {why}"
        for why, n in sorted(Counter(row["reason"] for row in held).items())
    ]
    apps = []
    for app, a in sorted(alloc.apps.items()):
        qos = classes[app]
        lat = measured.get(app)
        apps.append(
            {
                "app": app,
                "class": qos.name,
                "weight": qos.weight,
                "target_ms": qos.target_latency_ms,
                "max_violation_ratio": qos.max_violation_ratio,
                "demand_cores": a.demand_cores,
                "floor_cores": a.floor_cores,
                "allocated_cores": a.allocated_cores,
                "cap_cores": caps_by_app.get(app, 0.0),
                "cut_cores": a.cut_cores,
                "dp_units": a.dp_units,
                "latency_ms": lat,
                "latency_estimate_ms": _ms(estimates.get(app)),
                "predicted_violation_ratio": predicted_violation.get(app),
                "violation": lat is not None and lat > qos.target_latency_ms,
                # The latency feedback's gain this epoch sized the app with (its
                # target and drain span times it); null with the feedback off.
                "latency_gain": result.latency_gains.get(app),
            }
        )
    dp = alloc.dp
    rec = alloc.recommendation
    sizing = {
        "latency_model": result.latency_model,
        "latency_criterion": result.latency_criterion,
        # Per app: the quantile of waiting + service time that must meet the target
        # (None under the mean criterion) and the forecast quantile demand is sized for.
        "apps": [
            {
                "app": app,
                "sojourn_quantile": classes[app].sojourn_quantile
                if result.latency_criterion == "quantile"
                else None,
                "forecast_quantile": classes[app].forecast_quantile,
            }
            for app in sorted(alloc.apps)
        ],
        # Per operator (the order of `operators`): point forecast and sized rate,
        # the window's CPU per tuple when cost_model = "marginal" took `kappa` to
        # the sized rate (else null), and the C² of arrivals and service the
        # latency model used, with their source ("measured", "fixed: configured",
        # "fixed: not enough evidence").
        "operators": [
            {
                "app": op.app,
                "operator": op.operator,
                "forecast_quantile": fc.quantile,
                "point_rate": fc.rate,
                "sized_rate": fc.demand_rate,
                "window_kappa": fc.window_kappa,
                **_variability_row(result.variability.get(op)),
            }
            for op, fc in zip(views, map(forecasts.__getitem__, views), strict=True)
        ],
        # Per node: the interference correction of CPU per tuple ("applied <slowdown>")
        # or why there is none ("unavailable: ...", "off"), with the bandwidth
        # utilisation and slowdown behind it.
        "interference": dict(result.interference),
    }
    return {
        "epoch": epoch,
        "timestamp": now,
        "mode": mode,
        "slot_seconds": slot_seconds,
        "capacity_cores": dict(capacity),
        "usable_cores": dict(room),
        "operators": operators,
        "instances": instances,
        "apps": apps,
        "cuts": cuts,
        "dp": None
        if dp is None
        else {
            "unit_cores": dp.unit_cores,
            "capacity_units": dp.capacity_units,
            "value": dp.value,
            "seconds": dp.seconds,
            "solved": dp.solved,
        },
        "node_recommendation": None
        if rec is None
        else {
            "nodes_delta": rec.nodes_delta,
            "gain": rec.gain,
            "value_now": rec.value_now,
            "value_one_more": rec.value_one_more,
            "value_one_fewer": rec.value_one_fewer,
            "reason": rec.reason,
        },
        "node_pool_action": node_pool_action,
        "held": held,
        "placement": placement,
        "notes": [*alloc.notes, *held_notes],
        "actuator": actuator,
        "sent": acted.sent,
        "unreachable": acted.unreachable,
        "rejected": rejected,
        "sizing": sizing,
    }


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _app_lines(app: str, rec: dict[str, Any], row: dict[str, Any]) -> list[str]:
    verdict = "VIOLATION" if row["violation"] else "ok"
    lines = [
        f"epoch {rec['epoch']} ({rec['mode']}): {app} class {row['class']} "
        f"(weight {row['weight']:g}, target {row['target_ms']:g} ms) "
        f"demand {row['demand_cores']:.2f} cores, allocated {row['allocated_cores']:.2f}, "
        f"caps {row['cap_cores']:.2f}; latency measured {_f(row['latency_ms'], 1)} ms, "
        f"estimated {_f(row['latency_estimate_ms'], 1)} ms -> {verdict}"
    ]
    lines += _sizing_lines(app, rec.get("sizing"))
    reasons = sorted({o["reason"] for o in rec["operators"] if o["app"] == app})
    if reasons:
        lines.append(f"  demand set by: {', '.join(reasons)}")
    cut = [c for c in rec.get("cuts", []) if c["app"] == app]
    if cut:
        total = sum(c["cut_cores"] for c in cut)
        why = sorted({c["reason"] for c in cut})
        lines.append(f"  cut {total:.2f} cores over {len(cut)} instance(s): {'; '.join(why)}")
    rec_node = rec.get("node_recommendation")
    if rec_node and rec_node["nodes_delta"]:
        lines.append(f"  cluster: {rec_node['reason']}")
    pool = rec.get("node_pool_action")
    if pool and pool["recommended"] != "none":
        lines.append(f"  node pool ({pool['strategy']}): {pool['outcome']}: {pool['reason']}")
    # Records from before parallelism was decided have no entry.
    for op in (rec.get("parallelism") or {}).get("operators", []):
        if op["app"] == app and op["decided"] != op["current"]:
            lines.append(
                f"  parallelism {op['operator']}: {op['current']} -> {op['decided']} "
                f"({op['rule']}): {op['outcome']}: {op['reason']}"
            )
    return lines


def _sizing_lines(app: str, sizing: dict[str, Any] | None) -> list[str]:
    """How the app's demand was sized (records from before sizing have none)."""
    if not sizing:
        return []
    row = next((a for a in sizing.get("apps", []) if a["app"] == app), None)
    if row is None:
        return []
    ops = [o for o in sizing.get("operators", []) if o["app"] == app]
    point = sum(o["point_rate"] for o in ops)
    sized = sum(o["sized_rate"] for o in ops)
    target = (
        f"{row['sojourn_quantile']:g} quantile of latency"
        if row.get("sojourn_quantile") is not None
        else "mean latency"
    )
    return [
        f"  sized for the {row['forecast_quantile']:g} forecast quantile: {sized:.1f} "
        f"tuples/s over its operators (point forecast {point:.1f}); {target} by "
        f"{sizing.get('latency_model', '?')}"
    ]


def explain_lines(app: str, records: list[dict[str, Any]]) -> list[str]:
    """One line per epoch (plus one per cut) telling what ``app`` asked for, got and why."""
    lines = []
    for rec in records:
        row = next((a for a in rec.get("apps", []) if a["app"] == app), None)
        held = [h for h in rec.get("held", []) if h["app"] == app]
        if row is None and not held:
            continue
        if row is not None:
            lines += _app_lines(app, rec, row)
        else:
            lines.append(f"epoch {rec['epoch']} ({rec['mode']}): {app} has no measured instance")
        for why in sorted({h["reason"] for h in held}):
            mine = [h for h in held if h["reason"] == why]
            kept = sum(h["cap_cores"] for h in mine if h["cap_cores"] is not None)
            lines.append(
                f"  held: {why} ({len(mine)} instance(s) keep their caps, {kept:.2f} cores)"
            )
    if not lines:
        lines.append(f"{app}: no decision in the last {len(records)} epoch(s) mentions it")
    return lines
