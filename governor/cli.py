"""``governor``: the command line.  Settings come from the environment
(``core.settings.ENV_VARS``) and are built here, once, at the entry point.

    governor demo                 closed loop on embedded servers, with a report
    governor worker               the Faust stream worker
    governor executor --zone Z    one zone's command executor
    governor fleet                simulated fleet replaying a trace (live)
    governor servers              start embedded Kafka + Redis and wait
    governor bench pipeline       ingest throughput and decision latency
    governor bench control        every autoscaler on the same seeded workload
    governor bench frontier       attainment vs GPU-seconds, each strategy's knob swept, oracle as the limit
    governor bench traffic        routing/fallback, breaker, canary, agent weights (A/B)
    governor bench kv             KV fragmentation/relocation on Mooncake; cross-zone timing
    governor bench bandwidth      fit the bandwidth -> violation power law (docs/model.md §21 (bandwidth))
    governor bench tables|compare every deterministic fast-loop table as JSON; compare two such runs
    governor bench scrape         error of scrape-derived P95 TTFT / violation rate vs per-request truth
    governor bench admission      one admission review's cost at 100 and 1,000 registered tasks
    governor canary start|status|abort   a canary rollout (state in Redis; the worker drives it)
    governor pause|resume         kill switch: executors stop (resume) applying commands, no restart
    governor budget show|set|reset each zone's share of the fleet replica budget
    governor status               per (model, zone) state, liveness, lag, dead letters (--watch, --json)
    governor shadow-report        governor's targets vs the replicas an incumbent autoscaler ran
    governor redis-acl            least-privilege Redis ACL users (per-zone executors, worker, operator)
    governor tune                 Bayesian optimisation of the gains (writes a gains file)
    governor ingest otlp          OTLP/HTTP receiver: vLLM/SGLang request spans -> telemetry records
    governor ingest scrape        scrape vLLM/SGLang /metrics: histogram deltas -> telemetry records
    governor config check|show    check a config file (GOVERNOR_CONFIG); print the effective settings
    governor manifests            render the generated Kubernetes manifests (executor per zone, monitoring)
    governor admission add|list|check|remove   periodic agent tasks admitted by response-time analysis
    governor analyze ...          coupling graph, feasible region, certified gains

Over 400 lines: the one parser and the one dispatch of every subcommand; each command's code is in its own module.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from core.settings import CONFIG_ENV, CONFIG_HELP, ENV_VARS, Settings, SettingsError
from core.signing import NO_KEYS
from governor.logs import LOG_FORMATS, setup_logging

log = logging.getLogger("governor")

# One-shot commands that need servers: checked up front, so an unreachable one is one line and
# exit 2 in seconds, not a traceback after the clients' own timeouts.  (command, bench) ->
# (kafka, redis), where "env" checks only a server given in the environment (else it is embedded).
_NEEDS: dict[tuple[str, str | None], tuple[bool | str, bool | str]] = {
    ("demo", None): ("env", "env"),
    ("bench", "pipeline"): ("env", "env"),
    ("bench", "soak"): ("env", "env"),
    ("canary", None): (False, True),
    ("pause", None): (False, True),
    ("resume", None): (False, True),
    ("budget", None): (False, True),
    ("ingest", None): (True, False),  # the ingest receivers produce to Kafka
}


def build_parser() -> argparse.ArgumentParser:
    env_help = "\n".join(f"  {k:<28} {v}" for k, v in {CONFIG_ENV: CONFIG_HELP, **ENV_VARS}.items())
    p = argparse.ArgumentParser(
        prog="governor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"environment:\n{env_help}",
    )
    p.add_argument("--log-level", default=os.environ.get("GOVERNOR_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get("GOVERNOR_LOG_FORMAT") or "text",
        help="text, or json: one object per line (ts, level, logger, msg, model, zone, ...)",
    )
    p.add_argument("--version", action="version", version=f"governor {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the closed loop on embedded servers and print a report")
    d.add_argument("--trace", default="azure-conv", help="trace name or path (default azure-conv)")
    d.add_argument("--duration-s", type=float, default=600.0, help="trace seconds to replay")
    d.add_argument("--speed", type=float, default=5.0, help="trace seconds per wall second")
    d.add_argument("--qps", type=float, default=16.0, help="mean request rate the trace is scaled to")
    d.add_argument("--step-at-s", type=float, default=200.0, help="trace time of the load step (0 = none)")
    d.add_argument("--step-factor", type=float, default=2.5, help="load multiplier after the step")
    d.add_argument("--replicas", type=int, default=4, help="initial replicas per zone")
    d.add_argument("--startup-s", type=float, default=30.0, help="replica start-up delay (trace s)")
    d.add_argument(
        "--bad-rate",
        type=float,
        default=0.001,
        help="share of malformed telemetry records injected (shows the dead-letter path)",
    )
    d.add_argument("--out", default="runs/demo", help="report directory")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--no-progress", action="store_true", help="no live progress view")
    d.add_argument(
        "--no-feedforward",
        dest="feedforward",
        action="store_false",
        help="feedback PID only (default: profile the replica capacity, feedforward on)",
    )
    d.add_argument(
        "--shadow",
        action="store_true",
        help="executors dry-run: the fleet keeps --replicas (a static incumbent); writes shadow.json",
    )
    tel = "the fleet speaks: native records, vLLM /metrics to `ingest scrape`, or spans to `ingest otlp`"
    d.add_argument("--telemetry", choices=["native", "scrape", "otlp"], default="native", help=tel)
    plat = "where replica counts live: sim (the Redis desired hash) or k8s (the workloads of GOVERNOR_WORKLOADS on GOVERNOR_K8S_API_URL, scaled by the executors' k8s backend)"
    d.add_argument("--platform", choices=["sim", "k8s"], default="sim", help=plat)
    d.add_argument("--scrape-interval-s", type=float, default=5.0, help="scrape mode: trace s between scrapes")

    sub.add_parser("worker", help="run the Faust stream worker")

    e = sub.add_parser("executor", help="run one zone's command executor")
    e.add_argument("--zone", required=True)
    e.add_argument(
        "--backend",
        choices=["sim", "dry-run", "routing", "webhook", "k8s", "gateway"],
        default=None,
        help="every kind to one backend (default sim; GOVERNOR_EXECUTOR_BACKENDS chains them per kind): sim: the "
        "simulated fleet; dry-run: log only; routing: route/breaker/canary/agents into the gateway's Redis hashes "
        "(others fail); webhook: POST every command, signed, to GOVERNOR_WEBHOOK_URL",
    )
    e.add_argument("--webhook-url", default="", help="URL the webhook POSTs to (wins over GOVERNOR_WEBHOOK_URL)")

    f = sub.add_parser("fleet", help="run a simulated fleet that replays a trace (live)")
    f.add_argument("--trace", default="azure-conv")
    f.add_argument("--qps", type=float, default=40.0)
    f.add_argument("--duration-s", type=float, default=3600.0)
    f.add_argument("--replicas", type=int, default=4)
    f.add_argument("--startup-s", type=float, default=30.0)
    f.add_argument("--seed", type=int, default=7)

    sub.add_parser("servers", help="start embedded Kafka (Tansu) and Redis and wait")

    from governor.tune import add_parser as add_tune_parser

    add_tune_parser(sub)
    from governor.canary_cli import add_parser as add_canary_parser

    add_canary_parser(sub)
    from governor.pause_cli import add_parser as add_pause_parser

    add_pause_parser(sub)
    from governor.budget_cli import add_parser as add_budget_parser

    add_budget_parser(sub)
    from governor.status import add_parser as add_status_parser

    add_status_parser(sub)
    from governor.redis_acl import add_parser as add_redis_acl_parser

    add_redis_acl_parser(sub)
    from governor.shadow import add_parser as add_shadow_parser

    add_shadow_parser(sub)
    from governor.config_cmd import add_parser as add_config_parser

    add_config_parser(sub)
    from governor.manifests import add_parser as add_manifests_parser

    add_manifests_parser(sub)
    from governor.admission_cli import add_parser as add_admission_parser

    add_admission_parser(sub)
    from governor.analyze import add_parser as add_analyze_parser

    add_analyze_parser(sub)

    from governor.ingest_otlp import add_parser as add_otlp_parser

    add_otlp_parser(_ingest_subparsers(sub))
    from governor.ingest_scrape import add_parser as add_scrape_parser

    add_scrape_parser(_ingest_subparsers(sub))

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bp = bsub.add_parser(
        "pipeline", help="pipeline ingest (rows, columns; 1 and 2 workers) vs a raw consumer, memory, latency"
    )
    from governor.bench_pipeline import add_arguments as add_pipeline_arguments

    add_pipeline_arguments(bp)
    from governor.bench_control import add_parser as add_control_parser

    add_control_parser(bsub)
    from governor.bench_frontier import add_parser as add_frontier_parser

    add_frontier_parser(bsub)
    from governor.bench_seeds import add_parser as add_seeds_parser

    add_seeds_parser(bsub)
    from governor.bench_overload import add_parser as add_overload_parser

    add_overload_parser(bsub)
    from governor.bench_kv import add_parser as add_kv_parser

    add_kv_parser(bsub)
    from governor.bench_traffic import add_parser as add_traffic_parser

    add_traffic_parser(bsub)
    from governor.bench_bandwidth import add_parser as add_bw_parser

    add_bw_parser(bsub)
    from governor.bench_tables import add_parser as add_tables_parser

    add_tables_parser(bsub)
    from governor.bench_soak import add_parser as add_soak_parser

    add_soak_parser(bsub)
    from governor.bench_scrape import add_parser as add_scrape_bench_parser

    add_scrape_bench_parser(bsub)
    from governor.bench_admission import add_parser as add_admission_bench_parser

    add_admission_bench_parser(bsub)
    return p


def _ingest_subparsers(sub: Any) -> Any:
    """The ``governor ingest`` group's subparsers: created by the first ingest command that asks."""
    group = sub.choices.get("ingest")
    if group is None:
        group = sub.add_parser("ingest", help="receive engine telemetry and produce governor records")
        group.add_subparsers(dest="ingest", required=True)
    return next(a for a in group._actions if isinstance(a, argparse._SubParsersAction))


def _version() -> str:
    from streams.health import governor_version

    return governor_version()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.log_format not in LOG_FORMATS:  # a bad GOVERNOR_LOG_FORMAT default skips argparse's check
        print(f"governor: bad setting: GOVERNOR_LOG_FORMAT={args.log_format!r}: choose text or json", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    if args.command == "config":  # reads the file itself (no servers, and GOVERNOR_CONFIG need not be valid)
        from governor.config_cmd import run_config

        return run_config(args, os.environ)
    if args.command == "manifests":  # files only: no servers, no settings
        from governor.manifests import run_manifests

        return run_manifests(args)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"governor: bad setting: {exc}", file=sys.stderr)
        return 2
    # Children (worker, executors) inherit the flags through Settings.to_env.
    level = str(args.log_level).upper()
    settings = settings.replace(log_format=args.log_format, **({"log_level": level} if level in _LEVELS else {}))
    what = " ".join(str(w) for w in (args.command, getattr(args, "bench", None)) if w)
    needs = _NEEDS.get((args.command, getattr(args, "bench", None)))
    if needs is not None:
        from governor.embedded import unreachable

        kafka, redis = (n if isinstance(n, bool) else bool(os.environ.get(e)) for n, e in zip(needs, _ENV, strict=True))
        problem = unreachable(settings, os.environ, kafka=kafka, redis=redis, embeds="env" in needs)
        if problem:
            print(f"governor {what}: {problem}", file=sys.stderr)
            return 2
    try:
        return _dispatch(args, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        line = _expected_failure(exc, settings)
        if line is not None:
            print(f"governor {what}: {line}", file=sys.stderr)
            return 2
        log.exception("governor %s failed unexpectedly (%s)", what, type(exc).__name__)
        print(
            f"governor {what}: unexpected {type(exc).__name__}: {exc} (traceback above; please report it "
            "with the command line, and rerun with --log-level DEBUG for more)",
            file=sys.stderr,
        )
        return 1


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ENV = ("KAFKA_BOOTSTRAP", "REDIS_URL")


def _expected_failure(exc: BaseException, settings: Settings) -> str | None:
    """One line for a failure that is the environment's, not governor's (None: unexpected)."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from governor.embedded import ServerError

    why = " ".join(str(exc).split())[:300]
    if isinstance(exc, KafkaConnectionError | KafkaTimeoutError):
        return (
            f"Kafka at {settings.kafka_bootstrap} (KAFKA_BOOTSTRAP) failed: {why}; check the broker and KAFKA_BOOTSTRAP"
        )
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return f"Redis (REDIS_URL) failed: {why}; check that Redis is running and REDIS_URL names it"
    if isinstance(exc, ServerError):
        return f"an embedded server did not start: {why}; see the server logs of the run (servers/)"
    if isinstance(exc, SettingsError):
        return f"bad setting: {why}"
    from controllers.errors import ParameterError

    if isinstance(exc, ParameterError):  # a value the controllers refuse, e.g. from --gain
        return f"bad parameter: {why}"
    from sim.traces import TraceError

    if isinstance(exc, TraceError):  # a --trace that names no packaged trace, or a file it cannot read
        return f"bad trace: {why}"
    return None


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command in ("worker", "executor") and settings.keyring() is None:
        print(f"governor: {NO_KEYS}", file=sys.stderr)
        return 2
    if args.command == "admission":
        from governor.admission_cli import run_admission

        return run_admission(settings, args)
    if args.command == "analyze":
        from governor.analyze import run as run_analyze

        return run_analyze(settings, args)
    if args.command == "worker":
        from controllers.scaling_law import controller_problem
        from governor.worker import run_worker

        problem = controller_problem(settings)  # before any server: a bad gain is a setting, not a crash
        if problem:
            print(f"governor worker: bad setting: {problem}", file=sys.stderr)
            return 2
        return run_worker(settings)
    if args.command == "executor":
        from governor.executor_main import run_executor

        if args.zone not in settings.zones:
            print(f"governor: zone {args.zone!r} not in GOVERNOR_ZONES {settings.zones}", file=sys.stderr)
            return 2
        return asyncio.run(run_executor(settings, args.zone, args.backend, args.webhook_url))
    if args.command == "fleet":
        from governor.fleet_main import run_fleet

        return asyncio.run(run_fleet(settings, args))
    if args.command == "servers":
        return _servers(settings)
    if args.command == "canary":
        from governor.canary_cli import run_canary

        return run_canary(settings, args)
    if args.command == "redis-acl":
        from governor.redis_acl import run_redis_acl

        return run_redis_acl(settings, args)
    if args.command in ("pause", "resume"):
        from governor.pause_cli import run_pause

        return run_pause(settings, args)
    if args.command == "budget":
        from governor.budget_cli import run_budget

        return run_budget(settings, args)
    if args.command == "status":
        from governor.status import run_status

        return run_status(settings, args)
    if args.command == "shadow-report":
        from governor.shadow import run_shadow_report

        return run_shadow_report(settings, args)
    if args.command == "tune":
        from governor.tune import run_tune

        return run_tune(args)
    if args.command == "demo":
        from governor.demo import run_demo

        return run_demo(settings, args)
    if args.command == "ingest" and args.ingest == "otlp":
        from governor.ingest_otlp import run_ingest_otlp

        return run_ingest_otlp(settings, args)
    if args.command == "ingest" and args.ingest == "scrape":
        from governor.ingest_scrape import run_ingest_scrape

        return run_ingest_scrape(settings, args)
    if args.command == "bench" and args.bench == "pipeline":
        from governor.bench_pipeline import run_bench

        return run_bench(settings, args)
    if args.command == "bench" and args.bench == "bandwidth":
        from governor.bench_bandwidth import run_bandwidth

        return run_bandwidth(args)
    if args.command == "bench" and args.bench == "traffic":
        from governor.bench_traffic import run_traffic_bench

        return run_traffic_bench(args)
    if args.command == "bench" and args.bench == "kv":
        from governor.bench_kv import run_kv_bench

        return run_kv_bench(args)
    if args.command == "bench" and args.bench in ("tables", "compare"):
        from governor.bench_tables import run_compare, run_tables

        return run_tables(args) if args.bench == "tables" else run_compare(args)
    if args.command == "bench" and args.bench == "soak":
        from governor.bench_soak import run_soak

        return run_soak(settings, args)
    if args.command == "bench" and args.bench == "admission":
        from governor.bench_admission import run_admission_bench

        return run_admission_bench(args)
    if args.command == "bench" and args.bench == "scrape":
        from governor.bench_scrape import run_scrape_bench

        return run_scrape_bench(args)
    if args.command == "bench" and args.bench == "seeds":
        from governor.bench_seeds import run_seeds

        return run_seeds(args)
    if args.command == "bench" and args.bench == "overload":
        from governor.bench_overload import run_overload

        return run_overload(args)
    if args.command == "bench" and args.bench == "frontier":
        from governor.bench_frontier import run_frontier

        return run_frontier(args)
    if args.command == "bench" and args.bench == "control":
        from governor.bench_control import run_bench as run_control

        return run_control(args)
    return 2


def _servers(settings: Settings) -> int:
    from governor.embedded import EmbeddedServers

    with EmbeddedServers(settings, os.environ) as s:
        print(f"KAFKA_BOOTSTRAP={s.settings.kafka_bootstrap}")
        print(f"REDIS_URL={s.settings.redis_url}", flush=True)
        if s.generated_key:  # generated for this run: workers and executors need the same one
            print(f"GOVERNOR_COMMAND_KEYS={s.settings.command_keys}", flush=True)
        sigs = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            signal.sigwait(sigs)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
