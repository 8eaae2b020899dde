"""`--registry etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`, parsed and checked, and how to reach
that etcd (`RegistryTls`: `--registry-ca`, `--registry-cert`, `--registry-key`).

The endpoints are etcd's client URLs; the prefix (default `/minipd`) scopes every key minipd
writes, so several clusters can share one etcd. An optional `USER@` before the first
endpoint logs in to etcd with that user (etcd's own authentication), the password coming
from the environment variable ETCD_PASSWORD_ENV, never the command line. With a CA or a
client certificate the connection is TLS (etcd_tls.py): etcd's certificate is checked against
the CA (the system's roots without one), and the client certificate and key are presented to
an etcd that asks for them (`--client-cert-auth`). docs/multi-host.md says how to set up both.
"""

from __future__ import annotations

import os
import re

import msgspec

SCHEME = "etcd://"
DEFAULT_PREFIX = "/minipd"
ETCD_PASSWORD_ENV = "MINIPD_ETCD_PASSWORD"
MAX_PREFIX_CHARS = 200
_PREFIX = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
_USER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}$|^\[[0-9A-Fa-f:.]+\]$")


class RegistryTls(msgspec.Struct, frozen=True):
    """Files of TLS to etcd (paths; None: not given). Any of them turns TLS on."""

    ca: str | None = None  # the CA etcd's certificate must chain to (PEM)
    cert: str | None = None  # this process's client certificate (PEM), with `key`
    key: str | None = None

    @property
    def enabled(self) -> bool:
        return any((self.ca, self.cert, self.key))

    def validate(self) -> None:
        """ValueError naming the flag: a certificate without its key or the reverse, or a file
        that cannot be read."""
        if bool(self.cert) != bool(self.key):
            raise ValueError("registry_cert: --registry-cert and --registry-key go together (a client certificate "
                             "and its key)")  # fmt: skip
        for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"registry_{name}: cannot read {path!r}")


class RegistryUrl(msgspec.Struct, frozen=True):
    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX
    user: str | None = None
    tls: RegistryTls = RegistryTls()  # not part of the URL's text: its own flags

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return SCHEME + user + ",".join(f"{h}:{p}" for h, p in self.endpoints) + self.prefix


def parse_registry_url(text: str) -> RegistryUrl:
    """The URL `text` names; ValueError saying what is wrong with it otherwise."""
    if not text.startswith(SCHEME):
        raise ValueError(f"expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX], got {text!r}")
    rest = text[len(SCHEME) :]
    authority, slash, path = rest.partition("/")
    prefix = f"/{path}".rstrip("/") if slash else DEFAULT_PREFIX
    if not prefix or len(prefix) > MAX_PREFIX_CHARS or not _PREFIX.match(prefix):
        raise ValueError(
            f"prefix {prefix!r}: expected /NAME[/NAME...] of letters, digits, '.', '_' or '-' "
            f"(at most {MAX_PREFIX_CHARS} characters)"
        )
    user = None
    if "@" in authority:
        user, _, authority = authority.partition("@")
        if not _USER.match(user):
            raise ValueError(f"user {user!r}: expected letters, digits, '.', '_' or '-' (no password in the URL)")
    if not authority:
        raise ValueError(f"no endpoint in {text!r}; expected etcd://HOST:PORT")
    endpoints = []
    for endpoint in authority.split(","):
        host, sep, port = endpoint.rpartition(":")
        if not sep or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {endpoint!r}: expected HOST:PORT with a port in 1-65535")
        endpoints.append((host.strip("[]"), int(port)))
    return RegistryUrl(tuple(endpoints), prefix, user)


def check_login(url: RegistryUrl) -> None:
    """ValueError when the URL names a user and the password is not in the environment."""
    if url.user is not None and not os.environ.get(ETCD_PASSWORD_ENV):
        raise ValueError(
            f"registry: etcd://{url.user}@... logs in as {url.user!r}; set its password in ${ETCD_PASSWORD_ENV}"
        )
