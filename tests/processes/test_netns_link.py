"""The shaped namespace link of `bench.py linkbw`: set up as described, and always removed."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.loadgen.netns import NS_PREFIX, ShapedLink, namespaces, remove_stale, unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"shaped namespaces unavailable: {REASON}")
DEAD_PID = 4_194_304  # above Linux's largest pid: no such process can exist


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def our_interfaces(link: ShapedLink) -> list[str]:
    names = (link.kv_p, link.kv_d, link.root_p, link.p_root, link.root_d, link.d_root)
    return [name for name in names if name in sh("ip", "-o", "link", "show")]


def test_the_kv_crosses_only_the_shaped_pair_and_nothing_routes_out():
    with ShapedLink() as link:
        link.set_rate(0.25)
        assert {link.prefill_ns, link.decode_ns} <= set(namespaces())
        assert "tbf" in link.qdiscs() and "250Mbit" in link.qdiscs()
        # prefill reaches decode's kv address over the shaped veth, not through the root namespace
        route = sh(*link.exec_in(link.prefill_ns), "ip", "route", "get", link.decode_address)
        assert f"dev {link.kv_p}" in route
        # the router (root namespace) reaches both kv addresses over the unshaped control veths
        assert f"dev {link.root_p}" in sh("ip", "route", "get", link.prefill_address)
        assert f"dev {link.root_d}" in sh("ip", "route", "get", link.decode_address)
        for ns in (link.prefill_ns, link.decode_ns):
            assert "default" not in sh(*link.exec_in(ns), "ip", "route", "show")
        link.set_rate(0.05)  # reshaped in place
        assert "50Mbit" in link.qdiscs()
        link.unshape()
        assert "tbf" not in link.qdiscs()
    assert not {link.prefill_ns, link.decode_ns} & set(namespaces())
    assert our_interfaces(link) == []
    assert link.prefix + "." not in sh("ip", "-4", "route", "show")


def test_everything_is_removed_when_the_block_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with ShapedLink() as link:
            assert link.prefill_ns in namespaces()
            raise RuntimeError("boom")
    assert not {link.prefill_ns, link.decode_ns} & set(namespaces())
    assert our_interfaces(link) == []


def test_parallel_links_do_not_collide():
    with ShapedLink() as first, ShapedLink() as second:
        assert first.prefix != second.prefix
        assert {first.prefill_ns, first.kv_p} & {second.prefill_ns, second.kv_p} == set()
    assert not {first.prefill_ns, second.prefill_ns} & set(namespaces())


def test_namespaces_of_a_dead_run_are_removed():
    stale = f"{NS_PREFIX}-{DEAD_PID}-0-p"
    sh("ip", "netns", "add", stale)
    try:
        assert stale in remove_stale()
        assert stale not in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
