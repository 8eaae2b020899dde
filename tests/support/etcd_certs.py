"""A throwaway PKI for an etcd that serves TLS: a CA, etcd's certificate (for 127.0.0.1) and a
client certificate, made with `openssl` in a directory of the test's, valid for a day."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import NamedTuple

OPENSSL = shutil.which("openssl")
KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
TIMEOUT_S = 30


class EtcdCerts(NamedTuple):
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=TIMEOUT_S)


def make_certs(directory: str, host: str = "127.0.0.1") -> EtcdCerts:
    """A CA, and certificates it signed: etcd's (IP `host`, server and client use: etcd dials
    itself with it) and a client's (CN minipd)."""
    _openssl("req", "-x509", *KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=minipd test CA",
             cwd=directory)  # fmt: skip
    for name, usage, extra in (
        ("server", "serverAuth,clientAuth", f"subjectAltName=IP:{host}\n"),
        ("client", "clientAuth", ""),
    ):
        _openssl("req", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=minipd-{name}",
                 cwd=directory)  # fmt: skip
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(f"{extra}extendedKeyUsage={usage}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    return EtcdCerts(path("ca.pem"), path("server.pem"), path("server.key"), path("client.pem"), path("client.key"))
