"""Cluster membership through a registry (`--registry etcd://...`): instances publish
themselves under a lease they keep alive, routers watch the prefix and connect to what
appears there, and role switches are claimed there with a compare-and-swap.

`membership.py` is the interface the router and the instances depend on (and the embedded
default: no registry, instances register over the router's control port); everything that
imports the etcd client lives in the other modules, loaded only when `--registry` is set."""
