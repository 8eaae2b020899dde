"""The host names an HTTP server answers to: its defence against DNS rebinding.

A page on any web site can have its name re-resolved to 127.0.0.1 (DNS rebinding); the
browser then sends that page's requests to a local minipd as same-origin requests, so CORS
does not stop them, but they carry the site's name in `Host`. Answering only the names this
server is known by defeats that, as Django's ALLOWED_HOSTS, Jupyter and Vite's
`server.allowedHosts` do. `AllowedHosts.for_server(bind_host, extra)` is the list one server
checks; a `Host` is allowed when its host part is:
- an IP address, any: a rebinding attack needs a name whose resolution the attacker controls,
  and a literal address resolves to nothing (Vite's rule too). It also keeps every client that
  dials an address working: a bind to 0.0.0.0 reached at any of this machine's addresses, the
  multi-host setups whose clients dial the bound address, a port forwarded into a container;
- `localhost` or a name under `.localhost`, which browsers resolve to loopback themselves;
- the bound name, when the server binds a host name (`--http-host myhost.lan`);
- this machine's host name and fully qualified name, when it binds every address (0.0.0.0,
  `::`): clients elsewhere know it by those;
- an `--allowed-hosts` entry (`extra`): a name, an address, or `.example.com` for that
  domain and every name under it (Django's convention); `*` allows any `Host`, for a server
  behind a proxy that checks it.

Matching looks at the host part only: a port is ignored, case is ignored, one trailing dot
is ignored (`localhost.` is `localhost`), IPv6 brackets are dropped and addresses compared in
their canonical form (`[0::1]:8000` is `::1`). A value that is no host name at all (a path, a
space, a bad port) matches nothing.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import NamedTuple

ANY = "*"
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})  # a bind to every address of this machine
LOOPBACK_NAME = "localhost"
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")  # DNS labels; browsers send IDNs as punycode
_PORT = re.compile(r":([0-9]{1,5})")  # ASCII digits only: str.isdigit takes "²", which int() refuses


class HostPort(NamedTuple):
    host: str  # lower case, no trailing dot, an address in canonical form without brackets
    port: int | None  # None: the value named no port


def split_host(value: str) -> HostPort | None:
    """The host and port of a `Host` value (`name`, `name:port`, `[v6]:port`, or a bare IPv6
    address as an allow-list entry may be written), normalised; None when it is none."""
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        host, rest = (text[1:end], text[end + 1 :]) if end > 0 else ("", "")
        address = _address(host)
        if address is None or ":" not in address:  # brackets hold an IPv6 address, nothing else
            return None
    elif text.count(":") > 1:  # a bare IPv6 address: its colons are no port separator
        address, rest = _address(text), ""
        if address is None:
            return None
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        host = host[:-1] if host.endswith(".") else host
        address = _address(host)
        if address is None and not _NAME.fullmatch(host):
            return None
        address = address or host
    if not rest:
        return HostPort(address, None)
    port = _PORT.fullmatch(rest)
    if port is None or int(port[1]) > 65535:
        return None
    return HostPort(address, int(port[1]))


def _address(text: str) -> str | None:
    """`text` in canonical form when it is an IP address, else None."""
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return None


class AllowedHosts(NamedTuple):
    """The names one server answers to (module docstring); `allows` checks a `Host` value."""

    names: frozenset[str]  # normalised host parts
    domains: tuple[str, ...] = ()  # from `.example.com` entries: "example.com"
    any_host: bool = False  # `*`: no check at all

    @classmethod
    def for_server(cls, bind_host: str, extra: tuple[str, ...] = ()) -> "AllowedHosts":
        """The list of a server bound to `bind_host` with the `extra` entries allowed besides
        (ValueError naming the field for an entry that is none: `parse_entries`)."""
        entries = parse_entries(extra)
        if entries.any_host:
            return entries
        own = [LOOPBACK_NAME]
        if bind_host in WILDCARD_BINDS:
            own += [socket.gethostname(), socket.getfqdn()]
        else:
            own.append(bind_host)
        names = {parsed.host for name in own if (parsed := split_host(name)) is not None}
        return entries._replace(names=entries.names | names)

    def allows(self, value: str) -> bool:
        """Whether a `Host` value (`name[:port]`) names this server."""
        if self.any_host:
            return True
        parsed = split_host(value)
        if parsed is None:
            return False
        host = parsed.host
        if _address(host) is not None or host == LOOPBACK_NAME or host.endswith("." + LOOPBACK_NAME):
            return True
        return host in self.names or any(host == d or host.endswith("." + d) for d in self.domains)


def parse_entries(entries: tuple[str, ...]) -> AllowedHosts:
    """`--allowed-hosts` entries as a list (without this server's own names); ValueError
    naming the field for one that is no host name or address."""
    names, domains = set(), []
    for entry in (e.strip() for e in entries):
        if entry == ANY:
            return AllowedHosts(frozenset(), (), any_host=True)
        parsed = split_host(entry.removeprefix("."))
        if not entry or parsed is None or parsed.port is not None:
            raise ValueError(
                f"allowed_hosts: {entry!r} is not a host name or address (no scheme, port or path; "
                "'.example.com' allows a domain and the names under it, '*' any host)"
            )
        if entry.startswith("."):
            domains.append(parsed.host)
        else:
            names.add(parsed.host)
    return AllowedHosts(frozenset(names), tuple(domains))
