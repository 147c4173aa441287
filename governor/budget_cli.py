"""``governor budget show|set|reset``: each zone's share of the fleet budget (:mod:`core.budget`).

The fleet budget (``GOVERNOR_MAX_REPLICAS_TOTAL``, each model's
``max_replicas_total``) is split into one allowance per zone at
``<prefix>:budget:<zone>:allowance``; each zone's executor keeps its zone's
desired replicas within its allowance (:mod:`executors.budget`).  Who writes
them:

* the worker, at start (:func:`write_default_allowances`): an even split of
  the budgets over ``GOVERNOR_ZONES``, where an allowance is missing or
  malformed, where the last one was the worker's and the settings changed,
  and -- for every zone, with a warning -- where the operators' allowances
  no longer fit the budget (a lowered ``GOVERNOR_MAX_REPLICAS_TOTAL``);
* an operator: ``governor budget set az-a=64 az-b=36`` moves headroom
  between zones (every zone named, the sum at most the total; ``--model M``:
  that model's shares of its ``max_replicas_total``); ``--weights`` splits by
  weight instead (``governor budget set --weights az-a=2,az-b=1``);
  ``governor budget reset`` goes back to the worker's even split.  The
  worker leaves an operator's allowances alone while they fit.

``show`` prints each zone's allowance and its desired replicas of the
configured models (what its executor counts).  A lowered allowance does not
scale anything down: the zone's executor refuses increases until the zone is
back below it.  Exit 0, 2 for a bad argument or an unreachable Redis (one line
on stderr).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from typing import Any

import redis

from core import names
from core.budget import Allowance, BudgetError, default_allowances, split, within_budget
from core.settings import Settings
from core.transport import redis_options

__all__ = ["add_parser", "run_budget", "write_default_allowances"]

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("budget", help="each zone's share of the fleet replica budget: show, set, reset")
    bs = p.add_subparsers(dest="budget", required=True)
    bs.add_parser("show", help="each zone's allowance and desired replicas")
    s = bs.add_parser("set", help="set every zone's allowance (ZONE=N ..., sum <= the budget)")
    s.add_argument("shares", nargs="*", help="ZONE=N for every zone of GOVERNOR_ZONES")
    s.add_argument("--weights", default="", help="ZONE=W,... : split the budget by weight instead")
    s.add_argument("--model", default="", help="a model's shares of its max_replicas_total (default: the total)")
    bs.add_parser("reset", help="back to the worker's even split")


def _budgets(settings: Settings) -> tuple[int | None, dict[str, int]]:
    per_model = {m.name: m.max_replicas_total for m in settings.models if m.max_replicas_total is not None}
    return (settings.max_replicas_total or None), per_model


def _read(client: redis.Redis, settings: Settings) -> dict[str, Allowance | None]:
    keys = [names.zone_allowance(settings.topic_prefix, z) for z in settings.zones]
    return {z: Allowance.decode(raw) for z, raw in zip(settings.zones, client.mget(keys), strict=True)}


def _write(client: redis.Redis, settings: Settings, allowances: dict[str, Allowance]) -> None:
    """Every zone's allowance at once (``MULTI``/``SET``.../``EXEC``): never half a split."""
    with client.pipeline(transaction=True) as pipe:
        for z, a in allowances.items():
            pipe.set(names.zone_allowance(settings.topic_prefix, z), a.encode())
        pipe.execute()


def write_default_allowances(client: redis.Redis, settings: Settings, now_ms: int) -> list[str]:
    """The worker's write at start (see the module docstring); the zones written."""
    total, per_model = _budgets(settings)
    if total is None and not per_model:
        return []
    default = default_allowances(settings.zones, total, per_model, at_ms=now_ms)
    current = _read(client, settings)
    present = {z: a for z, a in current.items() if a is not None}
    if len(present) == len(current) and within_budget(present, total, per_model) is not None:
        log.warning("zone allowances no longer fit the fleet budget: back to the even split (governor budget set)")
        stale = list(settings.zones)
    else:
        stale = [
            z
            for z, a in current.items()
            if a is None
            or (a.by == "worker" and (a.total, dict(a.models)) != (default[z].total, dict(default[z].models)))
        ]
    if stale:
        _write(client, settings, {z: default[z] for z in stale})
    return stale


def _pairs(items: list[str], what: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        zone, eq, n = item.partition("=")
        try:
            v = float(n)
        except ValueError:
            v = math.nan
        if not eq or not math.isfinite(v):
            raise BudgetError(f"{what}: {item!r} is not ZONE=NUMBER")
        out[zone.strip()] = v
    return out


def _operator_allowances(settings: Settings, args: argparse.Namespace, now_ms: int) -> dict[str, Allowance]:
    total, per_model = _budgets(settings)
    if total is None and not per_model:
        raise BudgetError("GOVERNOR_MAX_REPLICAS_TOTAL / max_replicas_total: this deployment has no fleet budget")
    if args.budget == "reset":
        return default_allowances(settings.zones, total, per_model, at_ms=now_ms)
    if args.model and args.model not in per_model:
        raise BudgetError(f"--model: {args.model!r} has no max_replicas_total in GOVERNOR_MODELS")
    budget = per_model[args.model] if args.model else total
    if budget is None:
        raise BudgetError("GOVERNOR_MAX_REPLICAS_TOTAL: 0 (no fleet total); give --model M")
    if bool(args.weights) == bool(args.shares):
        raise BudgetError("give ZONE=N for every zone, or --weights ZONE=W,...")
    if args.weights:
        shares = split(budget, settings.zones, _pairs(args.weights.split(","), "--weights"))
    else:
        given = _pairs(args.shares, "shares")
        if set(given) != set(settings.zones) or not all(v == int(v) and v >= 0 for v in given.values()):
            raise BudgetError(f"shares: a whole number >= 0 for each of GOVERNOR_ZONES {list(settings.zones)}")
        shares = {z: int(given[z]) for z in settings.zones}
    base = default_allowances(settings.zones, total, per_model, at_ms=now_ms)
    out = {}
    for z, a in base.items():
        models = dict(a.models)
        if args.model:
            models[args.model] = shares[z]
        out[z] = Allowance(a.total if args.model else shares[z], models, total, per_model, by="operator", at_ms=now_ms)
    return out


def _show(client: redis.Redis, settings: Settings) -> None:
    total, per_model = _budgets(settings)
    configured = {m.name for m in settings.models}
    print(f"fleet budget: GOVERNOR_MAX_REPLICAS_TOTAL={total or 'none'}; per model: {per_model or 'none'}")
    for z, a in _read(client, settings).items():
        desired: dict[bytes, bytes] = client.hgetall(names.desired_replicas(settings.topic_prefix, z))  # type: ignore[assignment]
        counts = {k.decode(): int(v) for k, v in desired.items() if k.decode() in configured and v.isdigit()}
        if a is None:
            print(f"{z}: no valid allowance (scale-ups held); desired {sum(counts.values())} {counts}")
        else:
            print(f"{z}: allowance {a.total} {dict(a.models)} (by {a.by}); desired {sum(counts.values())} {counts}")


def run_budget(settings: Settings, args: argparse.Namespace) -> int:
    client = redis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    try:
        if args.budget == "show":
            _show(client, settings)
            return 0
        allowances = _operator_allowances(settings, args, int(time.time() * 1000))
        why = within_budget(allowances, *_budgets(settings))
        if why is not None:
            raise BudgetError(why)
        _write(client, settings, allowances)
        for z, a in allowances.items():
            print(f"{z}: allowance {a.total} {dict(a.models)}")
        return 0
    except BudgetError as exc:
        print(f"governor budget: {exc}", file=sys.stderr)
        return 2
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        why = " ".join(str(exc).split())
        print(f"governor budget: redis unreachable ({why}); set REDIS_URL to the governor's Redis", file=sys.stderr)
        return 2
    finally:
        client.close()
