"""The flags of `minipd --role cluster --launcher ray` (ray_cluster.py): which launcher, which
Ray cluster, the custom Ray resources each role's instances ask for, and how the ratio
controller may scale the pools (ray_scaling.py). Each entry names the config field it fills
(`sets`), whose default and type it takes (flag_fields.py)."""

from __future__ import annotations

import argparse
import json
import math

from minipd.control.role import Role
from minipd.entrypoints.flag_fields import flag_group
from minipd.entrypoints.flag_spec import CLUSTER, Flag
from minipd.policy.pool_scaling import ScalingConfig

LAUNCHERS = ("local", "ray")


def ray_resources(text: str) -> tuple[tuple[str, float], ...]:
    """A JSON object of Ray resource names to non-negative amounts, as `{"minipd_prefill": 1}`, as
    (name, amount) pairs."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"minipd_prefill\": 1}}': {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of resource names to amounts, got {text!r}")
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise argparse.ArgumentTypeError(f"resource {name!r}: expected a number >= 0, got {amount!r}")
        if name in ("CPU", "GPU", "memory"):
            raise argparse.ArgumentTypeError(f"resource {name!r}: CPUs and GPUs follow --cpus and --device")
    return tuple((name, float(amount)) for name, amount in sorted(value.items()))


_ray = flag_group({Role.CLUSTER}, CLUSTER)

FLAGS = (
    _ray(
        "--launcher",
        sets="cluster.launcher",
        choices=LAUNCHERS,
        help="who starts the instances: `local`, child processes of this one; `ray`, processes placed on a Ray "
        "cluster by Ray resources, each supervised by a Ray actor (needs `pip install 'minipd[ray]'`); the router "
        "runs here either way (default: %(default)s)",
    ),
    _ray(
        "--ray-address",
        sets="cluster.ray_address",
        metavar="ADDR",
        help="with --launcher ray: the Ray cluster to join (its GCS address, as `ray start` prints it); without "
        "it, a local Ray is started for the run, with the CPUs --cpus gives the instances, and stopped afterwards",
    ),
    _ray(
        "--ray-prefill-resources",
        sets="cluster.ray_prefill_resources",
        type=ray_resources,
        metavar="JSON",
        help="with --launcher ray: custom Ray resources each prefill instance asks for, pinning the pool to the "
        "nodes labelled with them, e.g. '{\"minipd_prefill\": 1}' (default: none)",
    ),
    _ray(
        "--ray-decode-resources",
        sets="cluster.ray_decode_resources",
        type=ray_resources,
        metavar="JSON",
        help="with --launcher ray: custom Ray resources each decode (and colocated) instance asks for (default: none)",
    ),
)


def _scaling_bound(end: str, role: str) -> Flag:
    return _ray(
        f"--{end}-{role}",
        sets=f"cluster.{end}_{role}",
        metavar="N",
        help=f"with --launcher ray: the {'fewest' if end == 'min' else 'most'} {role} instances the ratio "
        f"controller scales the pool to (default: --num-{role}, the start size); giving any pool scaling flag turns "
        "scaling on, refused with the local launcher",
    )


SCALING_FLAGS = (
    *(_scaling_bound(end, role) for role in ("prefill", "decode") for end in ("min", "max")),
    _ray(
        "--scale-idle-window-s",
        sets="cluster.scale_idle_window_s",
        metavar="S",
        help="with pool scaling: a pool with no request on any of its instances for this long, above its "
        f"minimum, drains and removes one instance (default: {ScalingConfig().idle_window_s:g})",
    ),
    _ray(
        "--scale-cooldown-s",
        sets="cluster.scale_cooldown_s",
        metavar="S",
        help=f"with pool scaling: at least this long between two adds or removes (default: "
        f"{ScalingConfig().cooldown_s:g})",
    ),
)
FLAGS = (*FLAGS, *SCALING_FLAGS)
