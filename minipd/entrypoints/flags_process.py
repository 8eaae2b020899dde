"""The flags every process takes: logging, bind address, shutdown and liveness, the secrets
and connection limits (security), and CPU placement. Each entry's `sets` names the config
field it fills (flag_spec.py); the defaults are those configs' own."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.engine.cpu_placement import format_cpu_list
from minipd.entrypoints.config_sections import ProcessConfig
from minipd.entrypoints.flag_spec import (
    ALL,
    API_KEY_ENV,
    CLUSTER_SECRET_ENV,
    ENGINE_ROLES,
    EVERY_CHILD,
    INSTANCES,
    LOG_LEVELS,
    NETWORKED,
    PLACEMENT,
    PROCESS,
    SECURITY,
    SERVING,
    cpu_list,
    flag,
    host_list,
)
from minipd.tracing.exporter import MIN_FLUSH_S

_PROCESS = ProcessConfig()

FLAGS = (
    flag(
        "--log-level",
        ALL,
        PROCESS,
        EVERY_CHILD,
        sets="process.log_level",
        default=_PROCESS.log_level,
        choices=LOG_LEVELS,
        help="logging verbosity (default: %(default)s)",
    ),
    flag(
        "--host",
        ALL,
        PROCESS,
        EVERY_CHILD,
        sets="process.host",
        default=_PROCESS.host,
        help="address this process's ports bind (control, KV, HTTP); a launcher binds every process there "
        "(default: %(default)s)",
    ),
    flag(
        "--shutdown-timeout-s",
        ALL,
        PROCESS,
        EVERY_CHILD,
        sets=("process.shutdown_timeout_s", "http.shutdown_timeout_s"),
        type=float,
        default=_PROCESS.shutdown_timeout_s,
        help="on SIGTERM or Ctrl-C: stop accepting, give the requests under way this long to finish, abort the "
        "rest, release everything and exit 0, all within this bound: the trace exporter's last flush gets what is "
        f"left of it (at least {MIN_FLUSH_S:g} s) and is dropped past it, with one log line (default: %(default)s)",
    ),
    flag(
        "--liveness-timeout-s",
        NETWORKED,
        PROCESS,
        EVERY_CHILD,
        sets=("process.liveness_timeout_s", "router.liveness_timeout_s"),
        type=float,
        default=_PROCESS.liveness_timeout_s,
        help="routers and instances heartbeat each other; one that sends nothing for this long is declared dead: "
        "no longer routed to, its requests retried or failed, whatever it held released. It also bounds a KV "
        "send that makes no progress. 0 disables heartbeats (default: %(default)s)",
    ),
    # ---- security
    flag(
        "--cluster-secret",
        NETWORKED,
        SECURITY,
        EVERY_CHILD,
        sets="process.cluster_secret",
        env=CLUSTER_SECRET_ENV,
        default=None,
        metavar="TEXT",
        help="shared secret of the cluster (at least 16 bytes): the control plane and the KV links authenticate "
        "every peer with it (an HMAC challenge, both ways) and refuse any that does not prove it. Prefer "
        f"the environment variable {CLUSTER_SECRET_ENV}, which keeps it out of `ps`. `cluster` generates one "
        "when none is given and hands it to its children. Without one, nothing is authenticated "
        "(default: none)",
    ),
    flag(
        "--api-key",
        SERVING,
        SECURITY,
        {Role.ROUTER},
        sets="http.api_key",
        env=API_KEY_ENV,
        default=None,
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on every HTTP route except /health (401 otherwise). Prefer the "
        f"environment variable {API_KEY_ENV} (default: none, the API is open)",
    ),
    flag(
        "--allowed-hosts",
        SERVING,
        SECURITY,
        {Role.ROUTER},
        ",".join,
        sets="http.allowed_hosts",
        type=host_list,
        default=(),
        metavar="NAMES",
        help="comma-separated host names the HTTP API answers to besides its own (against DNS rebinding: any "
        "other Host gets 403, and so does a POST whose Origin is another site's). Always allowed: every IP "
        "address, localhost, the name --host/--http-host binds, and with a bind to 0.0.0.0 or :: this "
        "machine's host name. '.example.com' allows that domain and the names under it; '*' turns the Host and "
        "Origin checks off, for a server behind a proxy that does them (default: none besides those)",
    ),
    flag(
        "--max-connections",
        NETWORKED,
        SECURITY,
        EVERY_CHILD,
        sets="process.max_connections",
        type=int,
        default=_PROCESS.max_connections,
        help="concurrent connections per listener (control port, tcp KV port, the router's client port); "
        "connections that have not authenticated give way to new ones (default: %(default)s)",
    ),
    # ---- CPU placement (see minipd/engine/cpu_placement.py); a launcher derives each child's share
    flag(
        "--cpus",
        ALL,
        PLACEMENT,
        EVERY_CHILD,
        format_cpu_list,
        sets=("process.cpus", "engine.cpus"),
        type=cpu_list,
        default=None,
        metavar="LIST",
        help="the cores this process runs on, in taskset's syntax (0-3,6); `cluster` divides them among its "
        "instances and leaves one to the router when there are enough (default: every core this process "
        "may use, not pinned)",
    ),
    flag(
        "--torch-threads",
        ENGINE_ROLES,
        PLACEMENT,
        INSTANCES,
        sets="engine.torch_threads",
        type=int,
        default=None,
        help="torch (OpenMP) threads of each engine's compute thread (default: one less than its cores, at "
        "least 1, leaving a core to the event loop; `cluster` gives each instance its share)",
    ),
    flag(
        "--no-cpu-placement",
        ALL,
        PLACEMENT,
        EVERY_CHILD,
        sets="engine.cpu_placement",
        dest="cpu_placement",
        action="store_false",
        help="leave thread counts, cores and OpenMP's idle spinning to torch's defaults (for comparison); "
        "--cpus and --torch-threads still apply",
    ),
)
