"""Picking with liveness: an instance whose stats are stale is picked only when no fresh one can
be; one declared dead or draining is never picked."""

from __future__ import annotations

from test_picking_units import handle, registry

from minipd.control.role import Role


def _stale(h):
    h.stale_after_s = 0.0  # any stats are too old now
    return h


def test_a_stale_decode_instance_is_not_trusted_while_a_fresh_one_exists():
    stale = _stale(handle("d-stale", Role.DECODE, free=100))  # would win on its (old) free blocks
    fresh = handle("d-fresh", Role.DECODE, free=10)
    r = registry(stale, fresh)
    assert r.pick_decode() is fresh
    assert r.pick_decode(exclude={"d-fresh"}) is stale  # but better than nothing


def test_a_stale_prefill_instance_is_not_trusted_while_a_fresh_one_exists():
    stale, fresh = _stale(handle("p-stale", Role.PREFILL)), handle("p-fresh", Role.PREFILL)
    r = registry(stale, fresh, handle("d", Role.DECODE))
    assert r.pick_prefill([]).instance is fresh


def test_lost_and_draining_instances_are_never_picked():
    lost, draining, ok = (handle(n, Role.DECODE, free=f) for n, f in (("lost", 90), ("draining", 80), ("ok", 5)))
    lost.mark_lost("declared dead: no heartbeat")
    draining.draining = True
    r = registry(lost, draining, ok)
    assert r.pick_decode() is ok
    assert r.pick_decode(exclude={"ok"}) is None
    assert not lost.is_alive and lost.lost_reason == "declared dead: no heartbeat"


def test_a_lost_decode_instance_is_remembered_until_it_registers_again():
    decode, prefill = handle("d-0", Role.DECODE), handle("p-0", Role.PREFILL)
    r = registry(decode, prefill)
    r.tell_peer_lost = lambda *args: None  # what the peers are told is not the point here
    r.lose(prefill, "p-0: connection closed", fenced=True)
    assert r.lost_decodes == {}  # only decode instances are named to a request finding none
    r.lose(decode, "d-0: connection closed (peer closed the connection)", fenced=True)
    assert r.pick_decode() is None
    assert r.lost_decodes == {"d-0": "d-0: connection closed (peer closed the connection)"}
    r.add(handle("d-0", Role.DECODE))  # restarted under the same id
    assert r.lost_decodes == {}
