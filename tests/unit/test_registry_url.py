"""`--registry etcd://...` as typed: parsed, refused with exit 2 naming the flag when
malformed, and a clear start-up error naming the `etcd` extra when the client is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minipd.ops.registry.etcd_url import DEFAULT_PREFIX, parse_registry_url
from minipd.ops.registry.records import BadRecord, decode_instance


def test_endpoints_prefix_and_user_are_parsed():
    url = parse_registry_url("etcd://10.0.0.1:2379,etcd-b.local:2380/prod/pd")
    assert url.endpoints == (("10.0.0.1", 2379), ("etcd-b.local", 2380))
    assert url.prefix == "/prod/pd" and url.user is None
    assert str(url) == "etcd://10.0.0.1:2379,etcd-b.local:2380/prod/pd"
    default = parse_registry_url("etcd://minipd@127.0.0.1:2379")
    assert default.prefix == DEFAULT_PREFIX and default.user == "minipd"


@pytest.mark.parametrize(
    "text, says",
    [
        ("http://127.0.0.1:2379", "expected etcd://HOST:PORT"),
        ("etcd://", "no endpoint"),
        ("etcd://127.0.0.1", "endpoint '127.0.0.1'"),
        ("etcd://127.0.0.1:0", "port in 1-65535"),
        ("etcd://127.0.0.1:2379,:2380", "endpoint ':2380'"),
        ("etcd://127.0.0.1:2379/a b", "prefix '/a b'"),
        ("etcd://u:secret@127.0.0.1:2379", "no password in the URL"),
    ],
)
def test_malformed_urls_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_registry_url(text)


def run_minipd(*argv: str, prelude: str = "") -> subprocess.CompletedProcess:
    code = f"import sys; {prelude}from minipd.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)


def test_a_bad_registry_flag_exits_2_naming_it():
    result = run_minipd("--role", "router", "--registry", "etcd://nowhere")
    assert result.returncode == 2
    assert "argument --registry: endpoint 'nowhere'" in result.stderr
    result = run_minipd("--role", "decode", "--registry", "etcd://127.0.0.1:2379", "--registry-ttl-s", "1")
    assert result.returncode == 2 and "argument --registry-ttl-s: must be at least 2" in result.stderr


def test_without_the_etcd_client_the_start_up_error_names_the_extra():
    result = run_minipd(
        "--role", "router", "--registry", "etcd://127.0.0.1:2379", prelude="sys.modules['aetcd'] = None; "
    )
    assert result.returncode == 2
    assert "needs the etcd client" in result.stderr and "pip install 'minipd[etcd]'" in result.stderr


def test_a_record_from_the_network_is_checked():
    with pytest.raises(BadRecord, match="bytes, more than"):
        decode_instance("x", b" " * (1 << 20))
    with pytest.raises(BadRecord, match="Expected `object`"):
        decode_instance("x", b"[]")
