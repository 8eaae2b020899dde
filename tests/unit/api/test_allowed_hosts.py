"""The host-name matching of the DNS rebinding guard (minipd/api/allowed_hosts.py): a `Host`
value's host part against a server's names, ignoring ports, case, one trailing dot and IPv6
brackets; IP addresses and localhost always allowed; `--allowed-hosts` entries (names, domains,
`*`) checked and added; a wildcard bind adding this machine's names."""

from __future__ import annotations

import socket

import pytest

from minipd.api.allowed_hosts import AllowedHosts, HostPort, parse_entries, split_host

LOOPBACK_SERVER = AllowedHosts.for_server("127.0.0.1")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("localhost", HostPort("localhost", None)),
        ("localhost:8000", HostPort("localhost", 8000)),
        ("LocalHost.:8000", HostPort("localhost", 8000)),  # case and one trailing dot
        ("Evil.Example.", HostPort("evil.example", None)),
        ("[::1]:8000", HostPort("::1", 8000)),
        ("[::1]", HostPort("::1", None)),
        ("::1", HostPort("::1", None)),  # a bare IPv6 address: its colons are no port
        ("[0:0:0:0:0:0:0:1]:80", HostPort("::1", 80)),  # compared in canonical form
        ("[FE80::A]:1", HostPort("fe80::a", 1)),
        ("127.0.0.1:65535", HostPort("127.0.0.1", 65535)),
        ("  myhost.lan  ", HostPort("myhost.lan", None)),
        ("xn--bcher-kva.example", HostPort("xn--bcher-kva.example", None)),  # an IDN, as browsers send it
    ],
)
def test_split_host_normalises(value, expected):
    assert split_host(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "evil.example:",  # a colon with no port
        "evil.example:80x",
        "evil.example:65536",
        "evil.example:²",  # a digit to str.isdigit, no port
        "[::1]:¹",
        "évil.example",
        "evil.example/admin",
        "evil example",
        "user@evil.example",
        "[::1",
        "[::1]x",
        "[::1]:",
        "[evil.example]:80",  # brackets hold an IPv6 address only
        "[127.0.0.1]",
        "a::b::c",  # colons, but no address
        "evil..example",
    ],
)
def test_split_host_refuses_what_is_no_host(value):
    assert split_host(value) is None
    assert not LOOPBACK_SERVER.allows(value)


@pytest.mark.parametrize(
    "value",
    [
        "localhost",
        "localhost:8000",
        "LOCALHOST:8000",
        "localhost.:8000",
        "dashboard.localhost:8000",  # browsers resolve names under .localhost to loopback themselves
        "127.0.0.1:8000",
        "[::1]:8000",
        "::1",
        "10.1.2.3:8000",  # any address: a rebinding attack needs a name
        "[2001:db8::5]:8000",
    ],
)
def test_loopback_names_and_every_address_are_allowed(value):
    assert LOOPBACK_SERVER.allows(value)


@pytest.mark.parametrize(
    "value",
    [
        "evil.example",
        "evil.example:8000",
        "EVIL.EXAMPLE.:8000",
        "localhost.evil.example:8000",  # ends with no .localhost
        "evillocalhost:8000",
        "127.0.0.1.evil.example",  # an address-like name is still a name
        "127.1:8000",  # not an address Python (or a browser's Host) writes: a name, and not ours
    ],
)
def test_foreign_names_are_refused(value):
    assert not LOOPBACK_SERVER.allows(value)


def test_the_bound_name_is_allowed_whatever_its_port_and_case():
    allowed = AllowedHosts.for_server("MyHost.Lan")
    assert allowed.allows("myhost.lan:9000") and allowed.allows("MYHOST.LAN.")
    assert not allowed.allows("otherhost.lan:9000") and not allowed.allows("sub.myhost.lan")


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", ""])
def test_a_wildcard_bind_allows_this_machines_names(bind):
    allowed = AllowedHosts.for_server(bind)
    assert allowed.allows(f"{socket.gethostname()}:8000")
    assert allowed.allows(socket.getfqdn().upper())
    assert not allowed.allows("evil.example:8000")


def test_extra_names_and_domains_are_added_to_the_servers_own():
    allowed = AllowedHosts.for_server("127.0.0.1", ("evil.example", ".corp.example", "[::2]"))
    assert allowed.allows("evil.example:8000") and allowed.allows("Evil.Example.")
    assert allowed.allows("corp.example") and allowed.allows("a.b.corp.example:1")
    assert allowed.allows("localhost:8000")  # the server's own names stay allowed
    assert not allowed.allows("sub.evil.example") and not allowed.allows("notcorp.example")
    assert not allowed.allows("other.example:8000")


@pytest.mark.parametrize("entries", [("*",), ("evil.example", " * ")])
def test_a_star_allows_any_host(entries):
    allowed = AllowedHosts.for_server("127.0.0.1", entries)
    assert allowed.any_host
    assert allowed.allows("evil.example:8000") and allowed.allows("") and allowed.allows("not a host")


@pytest.mark.parametrize(
    "entry",
    ["http://evil.example", "evil.example:8000", "evil.example/x", "", "*.example.com", "[::1]:80", ".", "a b"],
)
def test_entries_that_are_no_host_are_refused_naming_the_field(entry):
    with pytest.raises(ValueError, match=r"^allowed_hosts: .* is not a host name"):
        parse_entries((entry,))
