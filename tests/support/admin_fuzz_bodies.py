"""What the admin fuzz (tests/faults/test_admin_fuzz.py) sends: hypothesis strategies of calls
to the router's admin and control routes, as (method, path, headers, body bytes).

A call is, by weight: a body the route serves (`VALID`: small, so a load started is short, a
cap mild) with none, one or two of its fields gone wrong (an extreme number, any JSON value,
removed, or a field of no route added); any JSON value; raw bytes that are no JSON; or a GET
of a route that only reads, with a random query string. Extreme numbers
include what JSON cannot say or a float cannot hold: `Infinity`, `NaN`, `1e400`, `1e-400`, a
400-digit integer, written into the body as raw text (`Raw`). The call's content type is
mostly JSON, now and then another or none; its method now and then one the route has not.
"""

from __future__ import annotations

import json
import math
import re
from urllib.parse import quote

from hypothesis import strategies as st

INSTANCES = ("prefill-0", "decode-0")  # the launcher's names for a 1:1 cluster
LONG_TEXT = "x" * 20_000
POST_ROUTES = (
    "/admin/switch_role",
    "/admin/cluster_mode",
    "/admin/link_cap",
    "/admin/load",
    "/admin/load/stop",
    "/admin/controller",
    "/dashboard/slo",
)
GET_ROUTES = ("/admin/instances", "/admin/link_cap", "/admin/load", "/admin/controller", "/dashboard/snapshot")
QUERY_ROUTES = ("/dashboard/requests",)  # takes `limit`


class Raw:
    """A number written into the body as is (JSON has no Infinity, a float no 1e400)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text!r})"


RAW_MARK = "\x00raw:"
RAW_NUMBERS = [Raw("1e400"), Raw("-1e400"), Raw("1e-400"), Raw("-0"), Raw("1" + "0" * 400), Raw("Infinity")]
EXTREMES = [
    0,
    -0.0,
    1,
    -1,
    0.5,
    0.0009,
    0.001,
    3600,
    3600.5,
    10_000,
    10_000.5,
    3_600_000,
    3_600_000.5,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**40,
    1e-300,
    5e-324,
    1e308,
    -1e308,
    math.inf,
    -math.inf,
    math.nan,
]
numbers = (
    st.sampled_from(EXTREMES + RAW_NUMBERS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | st.integers(-(2**70), 2**70)
)
DIST_NUMBERS = ["inf", "-inf", "nan", "1e308", "1e-300", "0", "-1", "0.5", "1", "8", "100", "2048", str(2**64), "x", ""]
dist_texts = st.builds(
    lambda kind, fields: ":".join([kind, *fields]),
    st.sampled_from(["fixed", "uniform", "lognormal", "normal"]),
    st.lists(st.sampled_from(DIST_NUMBERS) | st.integers(-5, 5000).map(str), max_size=5),
) | st.sampled_from(["fixed:8", "uniform:4:16", "lognormal:20:0.5", "lognormal:20:0.5:1:64", "lognormal:inf:1:1:100"])
scalars = (
    st.none()
    | st.booleans()
    | numbers
    | st.text(max_size=16)
    | st.sampled_from(["", "prefill", "both", LONG_TEXT, *INSTANCES])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)

# Bodies a route serves (and acts on): kept small, so a load started is short, a cap mild.
drain = {"drain_timeout_s": st.sampled_from([1.0, 30.0])}
GOOD_LENGTHS = st.sampled_from(["fixed:8", "uniform:4:16", "lognormal:20:0.5", "lognormal:20:0.5:1:64"])
VALID = {
    "/admin/switch_role": st.fixed_dictionaries(
        {"instance": st.sampled_from(INSTANCES), "role": st.sampled_from(["prefill", "decode", "both"])},
        optional=drain,
    ),
    "/admin/cluster_mode": st.fixed_dictionaries({"mode": st.just("colocated")}, optional=drain)
    | st.fixed_dictionaries({"mode": st.just("split"), "prefill": st.just(1)}, optional=drain),
    "/admin/link_cap": st.fixed_dictionaries(
        {"instance": st.sampled_from(INSTANCES), "gbps": st.sampled_from([0.001, 0.5, 10_000, None])}
    ),
    "/admin/load": st.builds(
        lambda workload, arrivals, extra: {"workload": workload, **arrivals, **extra},
        st.sampled_from(["prefill-heavy", "decode-heavy"]),
        st.fixed_dictionaries({"rate": st.sampled_from([0.001, 5.0])})
        | st.fixed_dictionaries({"concurrency": st.sampled_from([1, 2])}),
        st.fixed_dictionaries(
            {},
            optional={
                "num_requests": st.sampled_from([1, 3]),
                "duration_s": st.sampled_from([0.5, 5.0]),
                "prompt_len": GOOD_LENGTHS,
                "output_len": GOOD_LENGTHS,
                "seed": st.integers(0, 2**64 - 1),
            },
        ),
    ),
    "/admin/load/stop": st.just({}),
    "/admin/controller": st.fixed_dictionaries(
        {},
        optional={
            "on": st.booleans(),
            "slo": st.fixed_dictionaries({"ttft_ms": st.just(1000)}, optional={"itl_ms": st.just(100)})
            | st.fixed_dictionaries({"ttft_ms": st.just(1000), "tpot_ms": st.just(100)}),
            "target": st.sampled_from([0.5, 0.9, 1.0]),
        },
    ),
    "/dashboard/slo": st.fixed_dictionaries(
        {"ttft_ms": st.sampled_from([0.001, 500.0]), "itl_ms": st.sampled_from([50.0, 3_600_000])}
    ),
}
ROUTE_FIELDS = {
    "/admin/switch_role": ("instance", "role", "drain_timeout_s"),
    "/admin/cluster_mode": ("mode", "prefill", "drain_timeout_s"),
    "/admin/link_cap": ("instance", "gbps"),
    "/admin/load": (
        "workload",
        "rate",
        "concurrency",
        "num_requests",
        "duration_s",
        "prompt_len",
        "output_len",
        "seed",
    ),
    "/admin/load/stop": (),
    "/admin/controller": ("on", "slo", "target"),
    "/dashboard/slo": ("ttft_ms", "itl_ms"),
}
LENGTH_FIELDS = ("prompt_len", "output_len")


def encode(value) -> bytes:
    """JSON text of `value`, `Raw` numbers written as they are."""
    text = json.dumps(value, default=lambda raw: RAW_MARK + raw.text)
    return re.sub('"' + re.escape(RAW_MARK) + '([^"]*)"', r"\1", text).encode()


@st.composite
def near_valid(draw, path: str):
    """A body `path` serves, with none, one or two fields gone wrong: set to an extreme
    number, any JSON value (or a distribution's text), removed, or a field of no route added."""
    body = dict(draw(VALID[path]))
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        field = draw(st.sampled_from([*ROUTE_FIELDS[path], "bogus", "x" * 40]))
        wrong = draw(st.sampled_from(["number", "value", "gone"] + ["length"] * (field in LENGTH_FIELDS)))
        if wrong == "gone":
            body.pop(field, None)
        elif wrong == "length":
            body[field] = draw(dist_texts)
        else:
            body[field] = draw(numbers if wrong == "number" else values)
        if field == "slo":
            body[field] = draw(st.dictionaries(st.sampled_from(["ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"]), numbers))
    return body


@st.composite
def calls(draw):
    """(method, path, headers, body bytes)"""
    shape = draw(st.sampled_from(["structured"] * 7 + ["value", "bytes", "get"]))  # structured: near-valid
    if shape == "get":
        path = draw(st.sampled_from(GET_ROUTES + QUERY_ROUTES))
        if path in QUERY_ROUTES or draw(st.booleans()):
            limit = draw(st.sampled_from(["1", "0", "-1", "1e400", "99999999", "", "%ff", "nan"]) | st.text(max_size=8))
            path += "?limit=" + quote(limit, safe="")
        return "GET", path, {}, b""
    path = draw(st.sampled_from(POST_ROUTES))
    if shape == "structured":
        body = encode(draw(near_valid(path)))
    elif shape == "value":
        body = encode(draw(values))
    else:
        body = draw(st.binary(max_size=40) | st.sampled_from([b"", b"{", b"[]", b"null", b'{"a":' * 300, b"\xff"]))
    content_type = draw(st.sampled_from(["application/json"] * 8 + ["application/json; charset=utf-8", "text/plain"]))
    method = draw(st.sampled_from(["POST"] * 30 + ["PUT", "DELETE"]))
    return method, path, {"Content-Type": content_type}, body
