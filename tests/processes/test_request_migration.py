"""Request migration (`--migration-limit`, router/migration.py) as users meet it: a streamed
completion whose decode process is SIGKILLed mid-stream goes on on the other decode instance,
in the same stream, and the caller gets the same text, finish reason and usage as an
uninterrupted run of the same greedy request (tiny, float32, KV over tcp, every prompt
prefilled on the prefill instance), parsed by the `openai` package. The router counts the
migration; the surviving pools end full.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import time
from typing import Iterator
from urllib.parse import urlsplit

import openai
import pytest
from disagg_helpers import ENGINE_ARGV
from http_helpers import sample, wait_until_pools_full

from minipd.control.role import Role
from minipd.entrypoints.process_cluster import ProcessCluster
from minipd.transports.backends import available_transports

ANNOUNCED = "serving the OpenAI API"
MAX_TOKENS = 400
PROMPT = "The router streams this answer from one decode instance, then from another."
TOKENS_BEFORE_THE_KILL = 10  # chunks with text the caller has read (the first chunk may have none)
MODEL_ARGV = ["--model", "small"]  # a real tokenizer, and steps slow enough to stop one mid-stream
REQUEST_TIMEOUT_S = 60.0
SNAPSHOT_BOUND_S = 10.0

pytestmark = pytest.mark.skipif("tcp" not in available_transports(), reason="the tcp transport is not available")


@contextlib.contextmanager
def _cluster(loop_thread) -> Iterator[tuple[ProcessCluster, str]]:
    cluster = ProcessCluster.from_argv(
        [
            "--transport", "tcp", *ENGINE_ARGV, *MODEL_ARGV, "--num-decode", "2", "--local-prefill-max-tokens", "-1",
            "--migration-limit", "1", "--http-port", "0",
        ]
    )  # fmt: skip
    loop_thread.run(cluster.start(), timeout=180)
    try:
        router = next(c for c in cluster.children if c.role is Role.ROUTER)
        url = next(line for line in router.announcements if ANNOUNCED in line).rsplit(" ", 1)[-1]
        yield cluster, url
    finally:
        loop_thread.run(cluster.stop(), timeout=60)


def _stream(client: openai.OpenAI):
    return client.completions.create(
        model="small",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )


def _decoding_on(base_url: str, after: float) -> str:
    """The decode instance the router routed the one running request to, from the first
    dashboard snapshot (pushed once a second on /dashboard/events) made after wall time
    `after`: its `inflight` is the router's own count, kept from the pick on."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=SNAPSHOT_BOUND_S)
    try:
        connection.request("GET", "/dashboard/events")
        response = connection.getresponse()
        assert response.status == 200, response.status
        for line in response:  # each read waits for the next pushed line, within the timeout
            if line.startswith(b"data: ") and (snapshot := json.loads(line[6:]))["time"] > after:
                [found] = [row["instance"] for row in snapshot["pools"]["decode"] if row["inflight"]]
                return found
    finally:
        connection.close()
    raise AssertionError("the event stream ended before a new snapshot")


def _read(chunks) -> tuple[str, str | None, object]:
    text, finish, usage = "", None, None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return text, finish, usage


def test_a_stream_whose_decode_instance_is_killed_goes_on_elsewhere_token_for_token(loop_thread):
    with _cluster(loop_thread) as (cluster, base_url):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=REQUEST_TIMEOUT_S, max_retries=0)
        reference = _read(_stream(client))
        assert reference[1] == "length" and reference[2].completion_tokens == MAX_TOKENS, reference

        chunks = iter(_stream(client))
        head = []
        while sum(bool(c.choices and c.choices[0].text) for c in head) < TOKENS_BEFORE_THE_KILL:
            head.append(next(chunks))  # tokens reached the caller
        decodes = [c for c in cluster.children if c.role is Role.DECODE]
        for child in decodes:  # frozen mid-stream, whichever it is on
            child.process.send_signal(signal.SIGSTOP)
        victim = _decoding_on(base_url, time.time())
        for child in decodes:
            child.process.send_signal(signal.SIGKILL if child.name == victim else signal.SIGCONT)
        text, finish, usage = _read(head + list(chunks))

        assert (text, finish) == reference[:2]  # the same answer, as if nothing had happened
        assert (usage.prompt_tokens, usage.completion_tokens) == (reference[2].prompt_tokens, MAX_TOKENS)
        samples = wait_until_pools_full(base_url)
        assert sample(samples, "minipd_requests_migrated_total") == 1
        # the survivor serves the next request as usual
        assert _read(_stream(client))[:2] == reference[:2]
