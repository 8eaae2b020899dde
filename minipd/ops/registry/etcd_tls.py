"""TLS to etcd. aetcd (1.x) dials plain gRPC only; `TlsClient` is its client with `connect`
dialing a secure channel instead: etcd's certificate is checked against the CA (the
system's roots without one) and the host name dialed, and the client certificate and key,
when given, are presented to an etcd that asks for them (`--client-cert-auth`). The rest
of the connection (the login with a user and password, the stubs, the watcher) is aetcd's
own `connect`, step for step. The files are read at each connect, so certificates renewed
on disk are used from the next reconnect on (etcd_client.py reconnects after failures).
"""

from __future__ import annotations

import asyncio

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc
from aetcd import watcher as aetcd_watcher

from minipd.ops.registry.etcd_url import RegistryTls


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def credentials(tls: RegistryTls) -> grpc.ChannelCredentials:
    """gRPC's channel credentials for `tls` (OSError when a file cannot be read)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca), private_key=_read(tls.key), certificate_chain=_read(tls.cert)
    )


class TlsClient(aetcd.Client):
    def __init__(self, host: str, port: int, tls: RegistryTls, **kwargs):
        super().__init__(host, port, **kwargs)
        self._tls = tls

    async def connect(self) -> None:
        """Establish a TLS connection to etcd (aetcd.Client.connect over a secure channel)."""
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = grpc.aio.secure_channel(target, credentials(self._tls), options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", reply.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd_watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        except rpc.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)  # raises aetcd's ClientError for it, as aetcd does
        finally:
            self._is_connecting = False
