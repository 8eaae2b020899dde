"""Opening a tier by URL: the Mooncake URL's defaults and parameters, bad URLs refused, secrets
kept out of messages."""

from __future__ import annotations

import asyncio

import pytest

from minipd.kvtier.fake_backend import FakeBackend
from minipd.kvtier.open_tier import open_kv_tier, parse_mooncake_url, redacted

MIB = 1 << 20


def test_a_mooncake_url_derives_the_metadata_server_from_the_master():
    settings = parse_mooncake_url("mooncake://127.0.0.1:50051")
    assert settings.master == "127.0.0.1:50051"
    assert settings.metadata == "http://127.0.0.1:50052/metadata"
    assert settings.local_hostname == "127.0.0.1"  # the route to a loopback master is loopback
    assert (settings.segment_bytes, settings.local_buffer_bytes, settings.staging_bytes) == (
        256 * MIB,
        16 * MIB,
        64 * MIB,
    )
    assert settings.protocol == "tcp"


def test_an_ipv6_master_keeps_its_brackets():
    settings = parse_mooncake_url("mooncake://[fd00::5]:50051?local_hostname=fd00::7")  # no route looked up
    assert (settings.master, settings.metadata) == ("[fd00::5]:50051", "http://[fd00::5]:50052/metadata")


def test_a_mooncake_url_takes_its_parameters():
    settings = parse_mooncake_url(
        "mooncake://10.0.0.5:7000?metadata=http://10.0.0.9:8080/metadata&local_hostname=10.0.0.7"
        "&segment_mib=1024&buffer_mib=32&staging_mib=128&protocol=rdma&rdma_devices=mlx5_0"
    )
    assert settings.metadata == "http://10.0.0.9:8080/metadata" and settings.local_hostname == "10.0.0.7"
    assert (settings.segment_bytes, settings.local_buffer_bytes, settings.staging_bytes) == (
        1024 * MIB,
        32 * MIB,
        128 * MIB,
    )
    assert (settings.protocol, settings.rdma_devices) == ("rdma", "mlx5_0")


@pytest.mark.parametrize(
    "url, words",
    [
        ("mooncake://127.0.0.1", "expected mooncake://HOST:PORT"),
        ("mooncake://127.0.0.1:1/path", "expected mooncake://HOST:PORT"),
        ("mooncake://127.0.0.1:1?segment=1", "unknown parameters ['segment']"),
        ("mooncake://127.0.0.1:1?segment_mib=lots", "whole number of MiB"),
        ("mooncake://127.0.0.1:1?staging_mib=0", "must be positive"),
    ],
)
def test_a_bad_mooncake_url_says_what_is_wrong(url, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_mooncake_url(url)


def test_an_unknown_scheme_is_refused_and_fake_is_in_process():
    with pytest.raises(ValueError, match="the scheme must be"):
        asyncio.run(open_kv_tier("memcached://host:1", bytes(16), 16))
    tier = asyncio.run(open_kv_tier("fake://", bytes(16), 16))
    assert isinstance(tier.backend, FakeBackend)


def test_a_password_never_reaches_a_message():
    assert redacted("redis://user:hunter2@host:6379/0") == "redis://user:***@host:6379/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"
