"""The names of minipd's spans, events and attributes (docs/observability.md, "Tracing", lists them).

One trace per request. The router's spans (service `minipd-router`):
    minipd.request      the request, from its arrival to its end (SpanKind.SERVER), a child
                        of the client's traceparent when it sent one
      minipd.try        one try: pick, placement decision, reserve/prefill/decode calls; a
                        retry is a second `minipd.try` under the same request
        minipd.recompute  the try's prompt recomputed on its decode instance (the KV did not load)
The instances' spans (service `minipd-instance`), children of the try (or recompute) that
asked for them:
    minipd.reserve      decode: blocks held for the prompt's KV
    minipd.prefill      prefill: the prompt computed, the first token sampled
      minipd.prefill.chunk   one chunk of a chunked prefill (its layers' KV final)
      minipd.kv_transfer     the KV sent into the reservation, one event per layer sent and landed
    minipd.decode       decode: from the Decode message to finish, abort or error
    minipd.generate     prefill and decode on one instance (colocated, short prompts, recomputes)
      minipd.kv_tier.fetch  (under prefill or generate) the prompt's blocks past the local hit
                        asked of the shared KV tier and fetched (disagg/tier_wire.py)
"""

ROUTER_SERVICE = "minipd-router"
INSTANCE_SERVICE = "minipd-instance"

REQUEST = "minipd.request"
TRY = "minipd.try"
RECOMPUTE = "minipd.recompute"
RESERVE = "minipd.reserve"
PREFILL = "minipd.prefill"
PREFILL_CHUNK = "minipd.prefill.chunk"
KV_TRANSFER = "minipd.kv_transfer"
DECODE = "minipd.decode"
GENERATE = "minipd.generate"
KV_TIER_FETCH = "minipd.kv_tier.fetch"

# events
PICKED = "picked"  # on minipd.try: the instances chosen
DECODE_BUSY = "decode_busy"  # on minipd.try: the decode pool was full, the reserve is asked again
LAYER_SENT = "layer_sent"  # on minipd.kv_transfer: a layer's blocks handed to the transport
LAYER_LANDED = "layer_landed"  # on minipd.kv_transfer: that layer's write completed
KV_LANDED = "kv_landed"  # on minipd.decode: the receiver saw the request's last byte land
FIRST_TOKEN = "first_token"  # on minipd.request, minipd.decode, minipd.generate
