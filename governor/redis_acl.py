"""``governor redis-acl``: least-privilege Redis ACL users for governor's processes.

Redis AUTH, ACL users and TLS all ride in ``REDIS_URL`` (plus the
``REDIS_TLS_*`` files, :func:`core.transport.redis_options`):

    REDIS_URL=redis://governor-exec-az-a:PASSWORD@redis:6379/0        ACL user + password
    REDIS_URL=redis://:PASSWORD@redis:6379/0                          requirepass (user default)
    REDIS_URL=rediss://governor-worker:PASSWORD@redis:6380/0          TLS; REDIS_TLS_CA_FILE=ca.pem
                                                                      (+ REDIS_TLS_CERT_FILE / _KEY_FILE
                                                                      when the server has tls-auth-clients)

A password with ``@ : / %`` must be percent-encoded in the URL
(:func:`redis_url_for` does it).

This command prints, for the deployment of the current settings
(``GOVERNOR_TOPIC_PREFIX``, ``GOVERNOR_ZONES``), one ``ACL SETUSER`` line per
user on stdout (``--acl-file``: the lines of a Redis ``aclfile`` instead),
ready for ``governor redis-acl | redis-cli --user ADMIN --askpass``.
Passwords never appear on stdout, only their SHA-256 (``#<hex>`` rules).
They come from ``--password-file`` (lines ``<user> <password>``, ``#``
comments); a user missing there gets a random one, printed once on stderr in
that same format (keep it: it is not stored anywhere).

The users, and why each key and command is there (``P`` = prefix, ``Z`` =
the zone; every key is an exact name, except where ``*`` is shown; glob
characters in names are escaped):

``governor-exec-Z`` -- ``governor executor --zone Z`` (any backend):

* ``P:commands:Z`` -- its command stream only: ``XGROUP CREATE`` (with
  ``MKSTREAM``), ``XREADGROUP``, ``XAUTOCLAIM``, ``XACK``.  No ``XADD``:
  an executor cannot write commands, not even to its own stream; no other
  zone's stream.
* ``P:applied:Z:*`` -- the applied markers (``EXISTS``, ``SET ... EX`` in
  ``MULTI``/``EXEC``).
* ``P:executor:Z:last_basis``, ``P:executor:Z:last_hlc`` -- staleness
  (``HGET``, ``HSET``); ``P:executor:Z:relocated:inflight`` -- relocation
  outcomes being relayed (``LMOVE``, ``LRANGE``, ``LREM``);
  ``P:executor:Z:heartbeat`` -- its liveness key (``SET ... PX``; on a
  clean stop ``WATCH``, ``GET``, ``MULTI``/``SET ... PX 1``/``EXEC``, no
  ``DEL``); ``P:executor:Z:last_result`` -- the last result per model
  (``HSET``).
* ``XPENDING`` on its stream: the delivery counter of a claimed entry
  (``GOVERNOR_MAX_DELIVERIES``).
* ``P:fleet:Z:desired`` (``WATCH``, ``HGET``, ``HGETALL``, ``HSET`` in
  ``MULTI``/``EXEC``: the zone's desired replicas, the fleet budget's ledger
  of every backend, :mod:`executors.budget`), ``P:fleet:Z:relocate``
  (``RPUSH``), ``P:fleet:Z:relocated`` (``LMOVE`` source), ``P:routing:Z``
  and ``P:breaker:Z`` (``HSET``) -- the sim and routing backends' desired
  state of its own zone; ``P:platform:Z:replicas`` (``HSET``) -- the replica
  truth it reads from its platform (``k8s`` backend).
* read only (``%R~``): ``P:paused`` -- the kill switch, ``GET`` before each
  command; ``P:budget:Z:allowance`` -- its zone's share of the fleet budget
  (``GET``), written by the worker or ``governor budget set``.
* No key of another zone, not even its desired replicas: the fleet budget
  is split into per-zone allowances, so no executor needs one
  (:mod:`core.budget`).  No ``EVAL``, ``FCALL`` or ``SCRIPT`` (a looping
  script would stall Redis for every client), no ``DEL``.
* commands: the above plus ``XPENDING``, ``TIME`` and ``PING`` (the RTT /
  clock-offset probes), ``WATCH``/``UNWATCH``/``MULTI``/``EXEC``/``DISCARD``.

Redis 7.0 or later is required: Redis 6.2 has no read-only key patterns
(``%R~``), so a key an executor may read it could also write, and its user
could set the pause key or its own allowance.  ``--redis-version 6.2`` is
refused (exit 2); ``--redis-version`` tailors the connection rules to one
7.x (below).

``governor-worker`` -- ``governor worker``:

* ``P:commands:Y`` of every zone: ``XADD`` (``MAXLEN ~``) only -- the bridge
  writes commands, it reads none.
* ``P:canary:*`` -- the rollouts it advances (``GET``, ``WATCH``,
  ``MULTI``/``SET``/``EXEC``, ``UNWATCH``, ``DISCARD``).
* ``P:snapshot:*`` -- the drivers' learned state (``GET``, ``MGET``, ``MSET``).
* ``P:executor:Y:heartbeat`` of every zone -- ``GET`` (read only, ``%R~``):
  whether the zone's executor is alive.
* ``P:budget:Y:allowance`` of every zone -- ``GET``, ``SET``: the default
  split of the fleet budget it writes at start (:mod:`core.budget`).
* ``P:status`` (``HSET``) and ``P:worker:heartbeat`` (``SET ... PX``): what
  ``governor status`` shows.
* ``P:admission`` -- periodic agent tasks (``HGETALL``, ``HSET``): the worker
  decides them (:mod:`loop.admission_driver`).
* ``P:platform:Y:replicas`` of every zone -- ``HGETALL``: the replica truth the
  zone's executor reads from its platform (read only from 7.0, like the heartbeats).
* ``P:retune`` (``HSET``): online retuning's record that ``governor status``
  shows; ``P:retune:paused`` (``EXISTS``, read only): its kill switch.
* ``TIME``: the worker's clock offset against Redis, for the cross-zone
  ``apply_at_ms`` (:mod:`loop.cross_zone`).

``governor-operator`` -- ``governor pause|resume``, ``governor canary
start|status|abort``, ``governor budget`` and ``governor status``:

* ``P:paused`` and ``P:retune:paused`` (``SET``, ``DEL``: ``--retune``), ``P:canary:*`` (``GET``, ``WATCH``,
  ``MULTI``/``SET``/``EXEC``, ``UNWATCH``, ``DISCARD``) and every zone's
  ``P:budget:Y:allowance`` (``GET``, ``SET``: ``governor budget set``).
* read only (``%R~``): ``P:status``, ``P:worker:heartbeat``, ``P:retune`` and, of every
  zone, ``P:executor:Y:heartbeat``, ``P:executor:Y:last_result``,
  ``P:breaker:Y`` and ``P:fleet:Y:desired`` (``GET``, ``MGET``,
  ``HGETALL``).

``governor-admission`` -- the agent orchestrators' ``governor admission
add|list|check|remove``: ``P:admission`` only (``HSET``, ``HGET``,
``HGETALL``, ``HDEL``); what they write the worker validates and decides.

Every user starts from ``reset`` (no keys, no channels, ``-@all``) and gets
only the commands above plus the connection basics ``AUTH``, ``HELLO``
(redis-py 8 connects with RESP3), ``PING``, ``SELECT`` (a ``/N`` database
in the URL) and the ``CLIENT`` subcommands redis-py sends on connect
(``SETINFO``, ``MAINT_NOTIFICATIONS``) only with a ``--redis-version``
whose ACL loads the rule: 7.x refuses the whole ``SETUSER`` for a
subcommand it does not have (7.0: none, 7.2+: ``SETINFO``).  Without them redis-py's connect-time ``CLIENT`` calls
are refused, which it ignores: one ``ACL LOG`` entry (``object: client``)
per connection, nothing more.  Never ``@dangerous``, ``KEYS``,
``SCAN``, ``FLUSHALL``, ``CONFIG`` or ``CLIENT KILL``; no Pub/Sub channels
(``resetchannels``).  The last line disables the ``default`` user (``off``,
no password, no keys, ``-@all``): apply the lines as an admin user of your
own (``ACL SETUSER admin on >... ~* &* +@all``), or you lock yourself out;
``--keep-default`` leaves it alone.

Not covered: the simulated fleet and gateways (``governor fleet``, readers
of the desired/routing/breaker hashes), and ``governor demo`` / ``governor
servers``, which run on their own embedded Redis.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import secrets
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from core import names
from core.settings import Settings

__all__ = [
    "AclUser",
    "RedisAclError",
    "acl_lines",
    "add_parser",
    "executor_user",
    "glob_escape",
    "operator_user",
    "read_passwords",
    "redis_url_for",
    "run_redis_acl",
    "users",
    "worker_user",
]

WORKER = "governor-worker"
OPERATOR = "governor-operator"
ADMISSION = "governor-admission"

#: What every client needs to connect: AUTH (and HELLO: redis-py 8 speaks RESP3), PING,
#: SELECT for a ``/N`` database.
CONNECTION = ("auth", "hello", "ping", "select")

#: CLIENT subcommands redis-py sends on connect (it ignores their errors, but each denial
#: is an ACL LOG entry), by the first Redis version whose ACL accepts the rule.  Redis 6.x
#: accepts any subcommand name; 7.x refuses the whole SETUSER for one it does not know.
CLIENT_INFO = (
    ("client|setinfo", ((6, 0), (7, 0)), ((7, 2), (99, 0))),
    ("client|maint_notifications", ((6, 0), (7, 0))),
)


def connection_commands(version: tuple[int, int] | None) -> tuple[str, ...]:
    """:data:`CONNECTION` plus the CLIENT subcommands a Redis of ``version`` accepts in a rule
    (None: any Redis 7.0 or later, so none of them)."""
    if version is None:
        return CONNECTION
    extra = [name for name, *spans in CLIENT_INFO if any(lo <= version < hi for lo, hi in spans)]
    return (*CONNECTION, *extra)


def parse_version(text: str) -> tuple[int, int]:
    """``"7.0"`` or ``"7.0.15"`` -> ``(7, 0)``; :class:`RedisAclError` below :data:`MIN_VERSION`."""
    try:
        major, minor = (int(p) for p in (text.split(".") + ["0"])[:2])
    except ValueError as exc:
        raise RedisAclError(f"--redis-version {text!r}: expected MAJOR.MINOR, e.g. 7.0 or 7.2") from exc
    if (major, minor) < MIN_VERSION:
        raise RedisAclError(
            f"--redis-version {text}: needs Redis 7.0 or later: Redis {major}.{minor} has no read-only key "
            "patterns (%R~), so each executor could write the pause key and its own budget allowance"
        )
    return major, minor


EXECUTOR_COMMANDS = (
    "xgroup|create",
    "xreadgroup",
    "xautoclaim",
    "xack",
    "xpending",
    "exists",
    "get",
    "set",
    "hget",
    "hset",
    "hgetall",
    "rpush",
    "lmove",
    "lrange",
    "lrem",
    "watch",
    "unwatch",
    "multi",
    "exec",
    "discard",
    "time",
)
TRANSACTION = ("watch", "unwatch", "multi", "exec", "discard")
WORKER_COMMANDS = ("xadd", "get", "mget", "set", "mset", "hset", "hgetall", "exists", "time", *TRANSACTION)
OPERATOR_COMMANDS = ("get", "set", "del", "mget", "hgetall", *TRANSACTION)
#: The first Redis whose ACL has read-only key patterns (``%R~``): what the rules need.
MIN_VERSION = (7, 0)
ADMISSION_COMMANDS = ("hget", "hset", "hgetall", "hdel")

_GLOB = re.compile(r"([*?\[\]\\])")


class RedisAclError(ValueError):
    """The settings or the password file cannot give a correct ACL."""


def glob_escape(name: str) -> str:
    """``name`` as a Redis key pattern that matches it alone (``*?[]\\`` escaped)."""
    return _GLOB.sub(r"\\\1", name)


def executor_user_name(zone: str) -> str:
    return f"governor-exec-{zone}"


@dataclass(frozen=True)
class AclUser:
    """One ACL user: key patterns (read-write), read-only patterns, commands."""

    name: str
    keys: tuple[str, ...]
    read_keys: tuple[str, ...]
    commands: tuple[str, ...]

    def rules(self, password_sha256: str, *, version: tuple[int, int] | None = None) -> list[str]:
        """The ``ACL SETUSER`` rules after the name (``reset`` first: applying twice is a no-op)."""
        out = ["reset", "on", f"#{password_sha256}", "resetchannels"]
        out += [f"~{k}" for k in self.keys]
        out += [f"%R~{k}" for k in self.read_keys]
        out.append("-@all")
        out += [f"+{c}" for c in dict.fromkeys((*connection_commands(version), *self.commands))]
        return out


def _check_names(prefix: str, zones: Sequence[str]) -> None:
    for what in (prefix, *zones):
        if not what or any(c.isspace() for c in what):
            raise RedisAclError(f"{what!r}: prefix and zone names must be non-empty, without spaces (ACL rules)")
    for a in zones:
        for b in zones:
            if a != b and b.startswith(f"{a}:"):
                raise RedisAclError(f"zones {a!r} and {b!r}: {a}'s key patterns would match {b}'s keys")


def executor_user(prefix: str, zone: str, zones: Sequence[str]) -> AclUser:
    """The ACL of ``governor executor --zone zone`` (see the module docstring)."""
    _check_names(prefix, zones)
    if zone not in zones:
        raise RedisAclError(f"zone {zone!r} not in GOVERNOR_ZONES {list(zones)}")
    own = [
        names.command_stream(prefix, zone),
        names.executor_last_basis(prefix, zone),
        names.executor_last_hlc(prefix, zone),
        names.relocation_inflight(prefix, zone),
        names.executor_heartbeat(prefix, zone),
        names.executor_last_result(prefix, zone),
        names.desired_replicas(prefix, zone),
        names.relocate_queue(prefix, zone),
        names.relocated_outcomes(prefix, zone),
        names.routing_hash(prefix, zone),
        names.breaker_hash(prefix, zone),
        names.platform_replicas(prefix, zone),
    ]
    keys = [glob_escape(k) for k in own]
    marker = names.applied_marker(prefix, zone, "")  # "<prefix>:applied:<zone>:"
    keys.append(glob_escape(marker) + "*")
    # Read only (%R~): the kill switch and its zone's share of the fleet budget; no other zone's key.
    read = (names.paused(prefix), names.zone_allowance(prefix, zone))
    return AclUser(
        executor_user_name(zone),
        keys=tuple(keys),
        read_keys=tuple(glob_escape(k) for k in read),
        commands=EXECUTOR_COMMANDS,
    )


def worker_user(prefix: str, zones: Sequence[str]) -> AclUser:
    """The ACL of ``governor worker``: XADD to every zone's stream, its canary, snapshot and status
    keys, GET of every zone's executor heartbeat."""
    _check_names(prefix, zones)
    keys = [glob_escape(names.command_stream(prefix, z)) for z in zones]
    keys.append(glob_escape(names.canary_state(prefix, "")) + "*")
    keys.append(glob_escape(names.snapshot(prefix, "")) + "*")
    keys += [glob_escape(names.status(prefix)), glob_escape(names.worker_heartbeat(prefix))]
    keys.append(glob_escape(names.admission(prefix)))
    keys.append(glob_escape(names.retune(prefix)))  # online retuning's record for governor status
    keys += [glob_escape(names.zone_allowance(prefix, z)) for z in zones]  # the default split, at start
    beats = tuple(glob_escape(names.executor_heartbeat(prefix, z)) for z in zones)
    platform = tuple(glob_escape(names.platform_replicas(prefix, z)) for z in zones)
    killed = (glob_escape(names.retune_paused(prefix)),)  # online retuning's kill switch: EXISTS
    return AclUser(WORKER, keys=tuple(keys), read_keys=beats + platform + killed, commands=WORKER_COMMANDS)


def operator_user(prefix: str, zones: Sequence[str] = ()) -> AclUser:
    """The ACL of ``governor pause|resume``, ``governor canary ...`` and ``governor status``."""
    _check_names(prefix, zones)
    keys = (
        glob_escape(names.paused(prefix)),
        glob_escape(names.retune_paused(prefix)),  # governor pause|resume --retune
        glob_escape(names.canary_state(prefix, "")) + "*",
        *(glob_escape(names.zone_allowance(prefix, z)) for z in zones),  # governor budget set
    )
    per_zone = (names.executor_heartbeat, names.executor_last_result, names.breaker_hash, names.desired_replicas)
    read = [
        names.status(prefix),
        names.worker_heartbeat(prefix),
        names.retune(prefix),
        *(f(prefix, z) for z in zones for f in per_zone),
    ]
    return AclUser(OPERATOR, keys=keys, read_keys=tuple(glob_escape(k) for k in read), commands=OPERATOR_COMMANDS)


def admission_user(prefix: str) -> AclUser:
    """The ACL of the agent orchestrators' ``governor admission add|list|check|remove``: the registry hash only."""
    return AclUser(ADMISSION, keys=(glob_escape(names.admission(prefix)),), read_keys=(), commands=ADMISSION_COMMANDS)


def users(prefix: str, zones: Sequence[str]) -> list[AclUser]:
    """Every user of a deployment: one executor per zone, the worker, the operator, the orchestrators."""
    return [
        *(executor_user(prefix, z, zones) for z in zones),
        worker_user(prefix, zones),
        operator_user(prefix, zones),
        admission_user(prefix),
    ]


#: The ``default`` user: off, no password, no keys, no commands.
DEFAULT_OFF = ("off", "resetpass", "resetkeys", "resetchannels", "-@all")


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_lines(
    all_users: Iterable[AclUser],
    passwords: Mapping[str, str],
    *,
    acl_file: bool = False,
    version: tuple[int, int] | None = None,
    disable_default: bool = True,
) -> list[str]:
    """``ACL SETUSER`` command lines (or aclfile ``user`` lines) for ``all_users``, ``default`` last."""
    head = "user" if acl_file else "ACL SETUSER"
    out = [" ".join([head, u.name, *u.rules(_sha256(passwords[u.name]), version=version)]) for u in all_users]
    if disable_default:
        out.append(" ".join([head, "default", *DEFAULT_OFF]))
    return out


def read_passwords(path: str | Path) -> dict[str, str]:
    """``<user> <password>`` lines (blank lines and ``#`` comments skipped)."""
    found: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, _, password = line.partition(" ")
        password = password.strip()
        if not password:
            raise RedisAclError(f"{path}:{n}: expected '<user> <password>'")
        found[user] = password
    return found


def redis_url_for(url: str, user: str, password: str) -> str:
    """``url`` (``redis://`` or ``rediss://``) with ``user:password@`` in place of any credentials."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    cred = f"{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{cred}@{host}"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "redis-acl",
        help="print least-privilege Redis ACL users (one per zone executor, worker, operator)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--acl-file", action="store_true", help="print aclfile 'user' lines instead of ACL SETUSER")
    p.add_argument("--password-file", default="", help="lines '<user> <password>'; missing users get a random one")
    p.add_argument(
        "--redis-version",
        default="",
        help="the Redis the rules are for (default: any 7.0 or later; older ones are refused: no %%R~ read-only keys)",
    )
    p.add_argument("--keep-default", action="store_true", help="do not disable the 'default' user")


def run_redis_acl(
    settings: Settings, args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        all_users = users(settings.topic_prefix, settings.zones)
        given = read_passwords(args.password_file) if args.password_file else {}
        version = parse_version(args.redis_version) if args.redis_version else None
    except (RedisAclError, OSError) as exc:
        print(f"governor redis-acl: {exc}", file=err)
        return 2
    generated = {u.name: secrets.token_urlsafe(24) for u in all_users if u.name not in given}
    lines = acl_lines(
        all_users,
        {**given, **generated},
        acl_file=args.acl_file,
        version=version,
        disable_default=not args.keep_default,
    )
    print("\n".join(lines), file=out)
    if generated:
        print("# generated passwords, shown once (a --password-file for the next run):", file=err)
        for user, password in generated.items():
            print(f"{user} {password}", file=err)
    return 0
