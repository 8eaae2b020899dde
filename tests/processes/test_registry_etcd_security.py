"""Membership in an etcd that protects itself (real etcd, real processes: a decode instance and
a router, `--registry-ttl-s 2`):

- with etcd's authentication on, the processes log in as a user that may read and write the
  cluster's prefix only (`etcd://USER@HOST:PORT`, the password in MINIPD_ETCD_PASSWORD): the
  instance registers, the router finds it and serves. etcd forgets every login token when it
  restarts: after a restart both log in again by themselves (the instance writes its
  deleted record back, the router sees it and serves), within the watch's reconnect backoff
  and one lease period;
- with etcd serving TLS only and requiring client certificates (a CA and certificates made
  with openssl in the test's directory; `--registry-ca/--registry-cert/--registry-key`), the
  same; a client without a certificate is refused.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from etcd_certs import OPENSSL, make_certs
from etcd_server import EtcdServer, needs_etcd, wait_until
from registry_cluster import TTL_S, RegistryCluster, timed

from minipd.ops.registry.etcd_url import ETCD_PASSWORD_ENV, parse_registry_url
from minipd.transports.backends import available_transports

pytestmark = [
    needs_etcd,
    pytest.mark.skipif("tcp" not in available_transports(), reason="no tcp transport"),
    pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed"),
]

PREFIX = "/secure"
USER, PASSWORD = "minipd", "the cluster's etcd password"
RECONNECT_BOUND_S = 2.0 + TTL_S + 1.0  # the watch's longest backoff, a lease period, the check's requests


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("pki")))


def serving(cluster: RegistryCluster) -> bool:
    router = cluster.processes["router"]
    return "decode-0" in cluster.instances(router) and cluster.serves(router)


def start(cluster: RegistryCluster) -> None:
    cluster.start_instance("decode-0")
    cluster.start_router("router")
    wait_until(lambda: serving(cluster), 30.0, "the router serves with decode-0")


def test_with_etcd_authentication_processes_log_in_and_again_after_an_etcd_restart(tmp_path):
    etcd = EtcdServer()
    cluster = RegistryCluster(
        etcd, PREFIX, str(tmp_path), env={ETCD_PASSWORD_ENV: PASSWORD}, url=f"etcd://{USER}@{etcd.endpoint}{PREFIX}"
    )
    try:
        etcd.start()
        etcd.enable_auth(USER, PASSWORD, f"{PREFIX}/")
        start(cluster)
        etcd.stop()
        etcd.start()  # every token the processes hold is unknown to it now
        key = cluster.key("instances", "decode-0")
        record = cluster.get(key)
        etcd.ctl("del", key)
        heal_s = timed(lambda: cluster.get(key) == record and serving(cluster), RECONNECT_BOUND_S, "logged in again")
        print(f"etcd with authentication, restarted: the record written back and served in {heal_s:.2f} s")
    finally:
        cluster.stop()
        etcd.close()


def test_with_etcd_tls_and_client_certificates_processes_register_and_serve(certs, tmp_path):
    etcd = EtcdServer(tls=certs)
    tls = ["--registry-ca", certs.ca, "--registry-cert", certs.client_cert, "--registry-key", certs.client_key]
    cluster = RegistryCluster(etcd, PREFIX, str(tmp_path), registry_argv=tls)
    try:
        etcd.start()
        start(cluster)
        print(f"etcd with TLS and client certificates: registered and served ({cluster.url})")
        assert refused_without_a_certificate(etcd.url(PREFIX), certs)
    finally:
        cluster.stop()
        etcd.close()


def refused_without_a_certificate(text: str, certs) -> bool:
    """Whether a put through the registry client, with the CA but no client certificate, fails."""
    from minipd.ops.registry.etcd_client import ETCD_ERRORS, EtcdEndpoints
    from minipd.ops.registry.etcd_url import RegistryTls

    url = msgspec.structs.replace(parse_registry_url(text), tls=RegistryTls(ca=certs.ca))

    async def put() -> bool:
        endpoints = EtcdEndpoints(url, call_timeout_s=5.0)
        try:
            await endpoints.client.put(f"{PREFIX}/intruder".encode(), b"1")
            return False
        except ETCD_ERRORS:
            return True
        finally:
            await endpoints.close()

    return asyncio.run(put())
