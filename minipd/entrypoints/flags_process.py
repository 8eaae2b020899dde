"""The flags every process takes: logging, bind address, shutdown and liveness, the secrets
and connection limits (security), and CPU placement. Each entry names the config field it
fills (`sets`), whose default and type it takes (flag_fields.py)."""

from __future__ import annotations

from minipd.control.role import Role
from minipd.engine.cpu_placement import format_cpu_list
from minipd.entrypoints.flag_fields import flag_group
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
    host_list,
)
from minipd.tracing.exporter import MIN_FLUSH_S

_process = flag_group(ALL, PROCESS, EVERY_CHILD)
_security = flag_group(NETWORKED, SECURITY, EVERY_CHILD)
_api_security = flag_group(SERVING, SECURITY, {Role.ROUTER})
_placement = flag_group(ALL, PLACEMENT, EVERY_CHILD)

FLAGS = (
    _process(
        "--log-level", sets="process.log_level", choices=LOG_LEVELS, help="logging verbosity (default: %(default)s)"
    ),
    _process(
        "--host",
        sets="process.host",
        help="address this process's ports bind (control, KV, HTTP); a launcher binds every process there "
        "(default: %(default)s)",
    ),
    _process(
        "--shutdown-timeout-s",
        sets=("process.shutdown_timeout_s", "http.shutdown_timeout_s"),
        help="on SIGTERM or Ctrl-C: stop accepting, give the requests under way this long to finish, abort the "
        "rest, release everything and exit 0, all within this bound: the trace exporter's last flush gets what is "
        f"left of it (at least {MIN_FLUSH_S:g} s) and is dropped past it, with one log line (default: %(default)s)",
    ),
    _process(
        "--liveness-timeout-s",
        roles=NETWORKED,
        sets=("process.liveness_timeout_s", "router.liveness_timeout_s"),
        help="routers and instances heartbeat each other; one that sends nothing for this long is declared dead: "
        "no longer routed to, its requests retried or failed, whatever it held released. It also bounds a KV "
        "send that makes no progress. 0 disables heartbeats (default: %(default)s)",
    ),
    # ---- security
    _security(
        "--cluster-secret",
        sets="process.cluster_secret",
        env=CLUSTER_SECRET_ENV,
        metavar="TEXT",
        help="shared secret of the cluster (at least 16 bytes): the control plane and the KV links authenticate "
        "every peer with it (an HMAC challenge, both ways) and refuse any that does not prove it. Prefer "
        f"the environment variable {CLUSTER_SECRET_ENV}, which keeps it out of `ps`. `cluster` generates one "
        "when none is given and hands it to its children. Without one, nothing is authenticated "
        "(default: none)",
    ),
    _api_security(
        "--api-key",
        sets="http.api_key",
        env=API_KEY_ENV,
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on every HTTP route except /health (401 otherwise). Prefer the "
        f"environment variable {API_KEY_ENV} (default: none, the API is open)",
    ),
    _api_security(
        "--allowed-hosts",
        sets="http.allowed_hosts",
        text=",".join,
        type=host_list,
        metavar="NAMES",
        help="comma-separated host names the HTTP API answers to besides its own (against DNS rebinding: any "
        "other Host gets 403, and so does a POST whose Origin is another site's). Always allowed: every IP "
        "address, localhost, the name --host/--http-host binds, and with a bind to 0.0.0.0 or :: this "
        "machine's host name. '.example.com' allows that domain and the names under it; '*' turns the Host and "
        "Origin checks off, for a server behind a proxy that does them (default: none besides those)",
    ),
    _security(
        "--max-connections",
        sets="process.max_connections",
        help="concurrent connections per listener (control port, tcp KV port, the router's client port); "
        "connections that have not authenticated give way to new ones (default: %(default)s)",
    ),
    # ---- CPU placement (see minipd/engine/cpu_placement.py); a launcher derives each child's share
    _placement(
        "--cpus",
        sets=("process.cpus", "engine.cpus"),
        text=format_cpu_list,
        type=cpu_list,
        metavar="LIST",
        help="the cores this process runs on, in taskset's syntax (0-3,6); `cluster` divides them among its "
        "instances and leaves one to the router when there are enough (default: every core this process "
        "may use, not pinned)",
    ),
    _placement(
        "--torch-threads",
        roles=ENGINE_ROLES,
        inherit=INSTANCES,
        sets="engine.torch_threads",
        help="torch (OpenMP) threads of each engine's compute thread (default: one less than its cores, at "
        "least 1, leaving a core to the event loop; `cluster` gives each instance its share)",
    ),
    _placement(
        "--no-cpu-placement",
        sets="engine.cpu_placement",
        dest="cpu_placement",
        action="store_false",
        help="leave thread counts, cores and OpenMP's idle spinning to torch's defaults (for comparison); "
        "--cpus and --torch-threads still apply",
    ),
)
