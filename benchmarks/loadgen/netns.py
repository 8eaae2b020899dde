"""A real kernel link for the KV: prefill and decode in network namespaces of their own, joined
by a veth pair that `tc` shapes (a token bucket filter for the rate, netem for a delay).

    root namespace: router, load client
      veth rp <-> pr  ->  namespace P (prefill)   kv address .1 on pk
      veth rd <-> dr  ->  namespace D (decode)    kv address .2 on dk
    namespace P: pk <=== shaped veth pair ===> dk :namespace D

Each instance binds its kv address (control port and TCP KV listener). The router reaches
them over the unshaped root veths (host routes); the KV, which the prefill instance sends to
the decode instance's kv address, can only cross the shaped pair. No namespace has a default
route, so nothing leaves the machine. Names carry the creating pid (`mpdbench-PID-N-p`), and
addresses come from a /24 of 10.200.0.0/13 that no interface uses, picked under a file lock,
so parallel runs do not collide; namespaces left by a dead run are removed on the next start.
Leaving the `with` block (however it ends) deletes both namespaces, which deletes the veths.
Needs root, `ip` and `tc`.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

from benchmarks.loadgen.signals import interrupts_deferred

NS_PREFIX = "mpdbench"
NS_PATTERN = re.compile(rf"^{NS_PREFIX}-(\d+)-\d+-[pd]$")
LOCK_FILE = Path("/tmp/minipd-bench-netns.lock")
SUBNET_FIRST_OCTET, SUBNET_SECOND_OCTETS = 10, range(200, 208)
KV_P, KV_D, ROOT_P, NS_P_SIDE, ROOT_D, NS_D_SIDE = 1, 2, 5, 6, 9, 10  # host parts in the /24
POINT_TO_POINT = 30
BITS_PER_BYTE = 8
MIN_BURST_BYTES = 64 * 1024  # above one GSO segment, so the bucket never stalls a packet outright
BURST_SECONDS = 0.004  # a tbf bucket must hold at least rate/HZ; 4 ms covers HZ=250
QUEUE_LATENCY_MS = 50  # longest a packet may wait in the bucket's queue before it is dropped
COMMAND_TIMEOUT_S = 30.0
_counter = itertools.count()


class NetnsError(RuntimeError):
    """A namespace, veth or qdisc could not be set up; the message says which command failed."""


def unavailable_reason() -> str | None:
    """Why shaped namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (iproute2)" if missing else None


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete namespaces of this bench whose creating process is gone; returns their names."""
    removed = []
    for name in namespaces():
        match = NS_PATTERN.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


def _free_prefix(seed: int) -> str:
    """A '10.X.Y' prefix no address or route of the root namespace uses."""
    used = _run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route", "show")
    candidates = [f"{SUBNET_FIRST_OCTET}.{a}.{b}" for a in SUBNET_SECOND_OCTETS for b in range(256)]
    start = seed % len(candidates)
    for prefix in candidates[start:] + candidates[:start]:
        if f"{prefix}." not in used:
            return prefix
    raise NetnsError("no free 10.200.0.0/13 subnet for the bench's namespaces")


class ShapedLink:
    """Two namespaces and three veth pairs; `set_rate` reshapes the KV pair while running."""

    def __init__(self) -> None:
        number = next(_counter)
        tag = f"{os.getpid()}-{number}"
        self.prefill_ns, self.decode_ns = f"{NS_PREFIX}-{tag}-p", f"{NS_PREFIX}-{tag}-d"
        short = f"mpb{os.getpid() % 10**6:06d}{number % 10}"  # interface names: at most 15 characters
        self.kv_p, self.kv_d = f"{short}pk", f"{short}dk"
        self.root_p, self.p_root = f"{short}rp", f"{short}pr"
        self.root_d, self.d_root = f"{short}rd", f"{short}dr"
        self.prefix = ""
        self.rate_gbps: float | None = None
        self.delay_ms = 0.0

    @property
    def prefill_address(self) -> str:
        return f"{self.prefix}.{KV_P}"

    @property
    def decode_address(self) -> str:
        return f"{self.prefix}.{KV_D}"

    def exec_in(self, namespace: str) -> list[str]:
        """The command prefix that runs a program inside `namespace`."""
        return ["ip", "netns", "exec", namespace]

    def __enter__(self) -> "ShapedLink":
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(f"shaped link: {reason}")
        remove_stale()
        LOCK_FILE.touch(exist_ok=True)
        with open(LOCK_FILE) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # picking a subnet and claiming it is one step for parallel runs
            try:
                self.prefix = _free_prefix(os.getpid())
                self._create()
            except BaseException:
                self.close()
                raise
        return self

    def _create(self) -> None:
        p, d, x = self.prefill_ns, self.decode_ns, self.prefix
        _run("ip", "netns", "add", p)
        _run("ip", "netns", "add", d)
        for ns in (p, d):
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        # the KV link between the namespaces
        _run("ip", "link", "add", self.kv_p, "netns", p, "type", "veth", "peer", "name", self.kv_d, "netns", d)
        _run("ip", "-n", p, "addr", "add", f"{x}.{KV_P}/{POINT_TO_POINT}", "dev", self.kv_p)
        _run("ip", "-n", d, "addr", "add", f"{x}.{KV_D}/{POINT_TO_POINT}", "dev", self.kv_d)
        # one unshaped control veth from the root namespace to each
        for ns, root_end, ns_end, root_host, ns_host, kv_host in (
            (p, self.root_p, self.p_root, ROOT_P, NS_P_SIDE, KV_P),
            (d, self.root_d, self.d_root, ROOT_D, NS_D_SIDE, KV_D),
        ):
            _run("ip", "link", "add", root_end, "type", "veth", "peer", "name", ns_end, "netns", ns)
            _run("ip", "addr", "add", f"{x}.{root_host}/{POINT_TO_POINT}", "dev", root_end)
            _run("ip", "-n", ns, "addr", "add", f"{x}.{ns_host}/{POINT_TO_POINT}", "dev", ns_end)
            _run("ip", "link", "set", root_end, "up")
            _run("ip", "-n", ns, "link", "set", ns_end, "up")
            _run("ip", "route", "add", f"{x}.{kv_host}/32", "via", f"{x}.{ns_host}", "dev", root_end)
        _run("ip", "-n", p, "link", "set", self.kv_p, "up")
        _run("ip", "-n", d, "link", "set", self.kv_d, "up")

    def set_rate(self, gbps: float, delay_ms: float = 0.0) -> None:
        """Shape both directions of the KV pair to `gbps` (and `delay_ms` each way, with netem)."""
        if not gbps > 0:
            raise ValueError(f"link rate: must be > 0 Gbit/s, got {gbps}")
        bits_per_s = gbps * 1e9
        burst = max(MIN_BURST_BYTES, int(bits_per_s / BITS_PER_BYTE * BURST_SECONDS))
        tbf = ["tbf", "rate", f"{int(bits_per_s)}bit", "burst", str(burst), "latency", f"{QUEUE_LATENCY_MS}ms"]
        for ns, dev in ((self.prefill_ns, self.kv_p), (self.decode_ns, self.kv_d)):
            _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            if delay_ms > 0:
                try:
                    _run(
                        "tc",
                        "-n",
                        ns,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "handle",
                        "1:",
                        "netem",
                        "delay",
                        f"{delay_ms}ms",
                    )
                except NetnsError as exc:
                    raise NetnsError(
                        f"link delay: this kernel has no netem qdisc (sch_netem); use a delay of 0 ({exc})"
                    ) from None
                _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:", "handle", "10:", *tbf)
            else:
                _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)
        self.rate_gbps, self.delay_ms = gbps, delay_ms

    def unshape(self) -> None:
        """Take the shaping off: the veth pair at the speed of the machine."""
        for ns, dev in ((self.prefill_ns, self.kv_p), (self.decode_ns, self.kv_d)):
            _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        self.rate_gbps, self.delay_ms = None, 0.0

    def qdiscs(self) -> str:
        """`tc qdisc show` of the KV pair's prefill end (for the record)."""
        return _run("tc", "-n", self.prefill_ns, "qdisc", "show", "dev", self.kv_p).strip()

    def close(self) -> None:
        """Delete both namespaces (their veths, and so the root ends, go with them); a Ctrl-C or
        SIGTERM meanwhile waits until they are gone."""
        with interrupts_deferred():
            for ns in (self.prefill_ns, self.decode_ns):
                _run("ip", "netns", "del", ns, check=False)
            for dev in (self.root_p, self.root_d):  # gone with their peers; removed here if a step failed early
                _run("ip", "link", "del", dev, check=False)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
