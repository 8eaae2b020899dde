"""The etcd client of one registry URL: one gRPC connection to one endpoint at a time,
moving to the next endpoint of the URL when a call finds the current one unreachable. With
a user in the URL it logs in (the password from the environment), and logs in again after a
failed call (etcd forgets its tokens when it restarts); with TLS files it dials TLS
(etcd_tls.py).

Every call has a deadline (`call_timeout_s`); `ETCD_ERRORS` is what a caller catches to
learn that etcd could not be reached or refused (then it keeps what it knows and retries).
Only this module and its siblings import `aetcd` (the `etcd` extra).
"""

from __future__ import annotations

import asyncio
import logging
import os

import aetcd
import aetcd.exceptions

from minipd.ops.registry.etcd_tls import TlsClient
from minipd.ops.registry.etcd_url import ETCD_PASSWORD_ENV, RegistryUrl

log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 2.0
# gRPC waits longer and longer between reconnects to an endpoint that refuses (1 s, growing
# 1.6 times up to 120 s): after a 10 s etcd outage its next try could come 6 s after etcd
# returned, past the lease etcd grants on its return (one TTL, 2 s at least), and every
# instance would be dropped by every router (tests/processes/test_registry_claims.py saw it
# once in three outages). Retrying every half second at most brings the first refresh well
# within that TTL.
CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 500,
}
ETCD_ERRORS = (aetcd.exceptions.ClientError, asyncio.TimeoutError, TimeoutError, OSError)
RevisionCompacted = aetcd.exceptions.RevisionCompactedError


class EtcdEndpoints:
    def __init__(self, url: RegistryUrl, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        self.url = url
        self.call_timeout_s = call_timeout_s
        self._index = 0
        self._client: aetcd.Client | None = None

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.url.endpoints[self._index]

    @property
    def client(self) -> aetcd.Client:
        if self._client is None:
            host, port = self.endpoint
            password = os.environ.get(ETCD_PASSWORD_ENV) if self.url.user else None
            options = dict(username=self.url.user, password=password, timeout=self.call_timeout_s,
                           options=CHANNEL_OPTIONS)  # fmt: skip
            if self.url.tls.enabled:
                self._client = TlsClient(host, port, self.url.tls, **options)
            else:
                self._client = aetcd.Client(host, port, **options)
        return self._client

    async def failover(self) -> None:
        """The current endpoint failed a call: the next call goes to the next one, on a new
        connection. With one endpoint, gRPC reconnects to it by itself, but a login is not
        renewed: with a user, the next call connects and logs in again (the call may have
        failed for a token etcd no longer knows: it forgets them all when it restarts)."""
        if len(self.url.endpoints) == 1 and self.url.user is None:
            return
        await self.close()
        if len(self.url.endpoints) > 1:
            self._index = (self._index + 1) % len(self.url.endpoints)
            log.info("registry: trying etcd at %s:%d", *self.endpoint)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), self.call_timeout_s)
            except ETCD_ERRORS:  # closing a channel to an etcd that is gone
                pass
