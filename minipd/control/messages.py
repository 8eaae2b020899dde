"""Every control-plane message, as msgspec Structs in one tagged union.

Each message names the request it concerns (`request_id`); calls that expect a reply carry a
`call_id` that the reply echoes. Decoding is typed: anything that is not one of these
messages, or has a field of the wrong type, is refused by the decoder (nothing is unpickled).
Longer than 400 lines because: the union is one module on purpose, so every message and its decoder are read together.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from minipd.control.kv_tier_report import KVTierReport
from minipd.control.role import Role
from minipd.engine.request import RequestOutput
from minipd.engine.sampling_params import SamplingParams
from minipd.models.arch.model_config import ModelConfig
from minipd.tracing.traceparent import TRACEPARENT_CHARS, TRACEPARENT_PATTERN

PROTOCOL_VERSION = 6  # 2: the handshake authenticates with the cluster secret; 3: liveness, role epochs;
# 4: SetLinkCap, traceparent on work messages, KVLanded.adopt_s, Stats step and refusal counts;
# 5: Welcome.start_nonce, and the server's proof covers the instance id and it
# 6: KVFailed, the one report of a KV that will not land (no CallError "transfer", no KVLanded.error);
#    KVEvents (the router's prefix index)
# TokenOutput.failure_kind, and CallError.kind, of requests that failed for this reason:
FAILURE_SHUTDOWN = "shutdown"  # the instance is shutting down and took nothing new
# KVFailed.side: the instance that saw the KV fail
KV_SIDE_PREFILL = "prefill"
KV_SIDE_DECODE = "decode"
# The trace a call belongs to (minipd/tracing): a version-00 W3C traceparent, checked by the
# decoder like any field; None: not traced.
TraceParentText = Annotated[str, msgspec.Meta(max_length=TRACEPARENT_CHARS, pattern=TRACEPARENT_PATTERN)]
# A prefill's times for the router's request timelines (Prefill.timeline): at most this many
# chunks and layers are carried (a longer prefill's further chunks are counted, not timed).
MAX_TIMELINE_CHUNKS = 64
MAX_TIMELINE_LAYERS = 256
Interval = tuple[float, float]


class Fingerprint(msgspec.Struct, frozen=True):
    """What two instances must share for one's KV blocks to mean the same in the other's pool."""

    protocol_version: int
    model: ModelConfig
    weights_digest: str
    dtype: str
    block_size: int
    kv_layout: str
    # "quantized" (4-bit projections served as stored), "mixed" (so, prefill rows through dense
    # copies) or "dense": logits differ
    weights: str = "dense"
    # What multiplies quantized weights ("vnni", "avx2" or "torch"; "" for dense): logits may differ
    quantized_kernel: str = ""

    def differences(self, other: "Fingerprint") -> list[str]:
        """Human-readable `field: ours != theirs` for every differing field."""
        out = []
        for field in self.__struct_fields__:
            ours, theirs = getattr(self, field), getattr(other, field)
            if field == "model" and ours != theirs:
                out += [
                    f"model.{f}: {getattr(ours, f)!r} != {getattr(theirs, f)!r}"
                    for f in ours.__struct_fields__
                    if getattr(ours, f) != getattr(theirs, f)
                ]
            elif ours != theirs:
                out.append(f"{field}: {ours!r} != {theirs!r}")
        return out


class Message(msgspec.Struct, tag_field="type", kw_only=True):
    request_id: str = ""


class Call(Message, kw_only=True):
    call_id: int = 0


class Reply(Message, kw_only=True):
    call_id: int = 0


# ---- handshake (minipd/control/handshake.py) ---------------------------------------------
class Hello(Call, tag="hello"):
    """Sent by whoever opens a connection; answered by `Challenge` (the server has a cluster
    secret), `Welcome` (it has none) or `CallError`."""

    protocol_version: int
    role: Role  # ROUTER, CLIENT, or an instance role
    nonce: bytes = b""  # the client's half of the challenge
    liveness_timeout_s: float = 0.0  # > 0: both ends heartbeat, and this end declares the other dead after it


class Challenge(Reply, tag="challenge"):
    """Server -> client: prove the cluster secret over both nonces (answer with `Prove`)."""

    nonce: bytes


class Prove(Call, tag="prove"):
    """Client -> server: the client's proof; answered by `Welcome` or `CallError`."""

    proof: bytes


class Welcome(Reply, tag="welcome"):
    instance_id: str
    role: Role
    fingerprint: Fingerprint | None = None
    transport: str = ""
    transport_description: bytes = b""
    model_name: str = ""
    max_model_len: int = 0
    max_num_seqs: int = 0
    proof: bytes = b""  # the server's proof of the cluster secret (empty without one)
    epoch: int = 0  # the instance's role epoch: bumped by every role switch
    liveness_timeout_s: float = 0.0  # how soon this end declares a silent peer dead (it heartbeats if > 0)
    # What the instance computes on: host and device, and the cores its compute thread is
    # pinned to ("node1/cpu:0", "node1/cuda:0"); instances with the same value share that
    # hardware, and its speed. "": not said (a router, an older instance).
    compute: str = ""
    # Random at the instance's process start, the same for all its connections: which run of
    # the instance this is (the registry's record names it, and the router checks the two
    # agree). b"": not an instance (a router's client port).
    start_nonce: bytes = b""


class Heartbeat(Message, tag="heartbeat"):
    """Sent on a connection whose Hello asked for liveness, a few times per liveness timeout;
    any frame counts as a sign of life, this one only says nothing else was to be said."""


class Evict(Message, tag="evict"):
    """Router -> instance: you were declared dead (`reason`) and are no longer routed to. End
    every request of this connection (writes to peers included), then close it."""

    reason: str


class Draining(Message, tag="draining"):
    """Instance -> router: shutting down; route nothing new here (requests under way finish)."""


# The prefix index (router/prefix_index.py): what an instance's prefix cache, or the shared KV
# tier through it, gained and lost, in the shape of vLLM's KV events. Hashes are the engine's
# chained block hashes (engine/block_manager.py:chain_hashes). Bounded: a message carries at
# most MAX_KV_EVENTS events of at most MAX_KV_EVENT_HASHES hashes each, and the publisher puts
# at most KV_EVENTS_MESSAGE_HASHES hashes in one (about 10 KiB, under every frame cap).
MAX_KV_EVENTS = 64
MAX_KV_EVENT_HASHES = 256
KV_EVENTS_MESSAGE_HASHES = 1024
BlockHashes = Annotated[list[int], msgspec.Meta(max_length=MAX_KV_EVENT_HASHES)]
KV_MEDIUM_LOCAL, KV_MEDIUM_TIER = "local", "tier"
KVMedium = Literal["local", "tier"]


class BlockStored(msgspec.Struct, tag="block_stored", tag_field="kind", frozen=True):
    """Blocks now held, in chain order; `parent_block_hash` the block before the first (None:
    the prompt's start). `token_ids` are never sent (the hashes name the prefix)."""

    block_hashes: BlockHashes
    parent_block_hash: int | None
    block_size: int
    medium: KVMedium = KV_MEDIUM_LOCAL
    token_ids: None = None  # vLLM's field, never filled here: a message stays a list of hashes


class BlockRemoved(msgspec.Struct, tag="block_removed", tag_field="kind", frozen=True):
    block_hashes: BlockHashes
    medium: KVMedium = KV_MEDIUM_LOCAL


class AllBlocksCleared(msgspec.Struct, tag="all_blocks_cleared", tag_field="kind", frozen=True):
    """Everything held in `medium` forgotten (a pool reset, or a resync before a snapshot)."""

    medium: KVMedium = KV_MEDIUM_LOCAL


class SubscribeKVEvents(Message, tag="subscribe_kv_events"):
    """Router -> instance, once it registered the instance: send me `KVEvents`, a snapshot of
    what is cached now first (no reply)."""


class KVEvents(Message, tag="kv_events"):
    """Instance -> router: a batch of prefix-cache events, oldest first (no reply)."""

    events: Annotated[list[BlockStored | BlockRemoved | AllBlocksCleared], msgspec.Meta(max_length=MAX_KV_EVENTS)]


class CallError(Reply, tag="error"):
    """A refused call, or (sent in place of a stream's first output) a refused `Generate`."""

    message: str
    # "invalid" (bad input), "busy" (no capacity), "auth" (the
    # handshake failed or the peer may not send this), "error", and STALE_EPOCH: new work
    # meant for a role the instance no longer has, or sent while it switches roles
    # (disagg/role_switch.py); the router tries the request elsewhere
    kind: str = "error"


STALE_EPOCH = "stale_epoch"
DRAIN_TIMEOUT = "timeout"  # a role switch whose drain outlasted its timeout (nothing changed)


# ---- disaggregated request flow ----------------------------------------------------------
class Reserve(Call, tag="reserve"):
    """Router -> decode: hold blocks for the prompt before prefill starts."""

    token_ids: list[int]
    prefill_instance: str
    epoch: int | None = None  # the role epoch the sender saw; a stale one is refused (None: unchecked)
    traceparent: TraceParentText | None = None  # the router's span of this try


class Reserved(Reply, tag="reserved"):
    num_cached_tokens: int  # prompt tokens the decode instance already holds (block-aligned)
    dst_block_ids: list[int]  # where blocks num_cached_tokens // block_size onward must go
    lease_s: float  # the reservation is freed if decoding has not started by then


class Prefill(Call, tag="prefill"):
    """Router -> prefill: compute the prompt's KV, stream it into the reserved blocks; answered
    by `Prefilled`, a CallError, or (the KV did not move) `KVFailed` in place of a reply."""

    token_ids: list[int]
    sampling: SamplingParams
    decode_instance: str
    decode_description: bytes
    decode_fingerprint: Fingerprint
    dst_block_ids: list[int]
    num_skip_blocks: int  # leading blocks the decode instance already holds
    layerwise: bool = True
    epoch: int | None = None  # as in Reserve
    lease_s: float = 0.0  # the reservation's lease: the prefill instance renews it (`Renew`) while it progresses
    traceparent: TraceParentText | None = None  # as in Reserve
    timeline: bool = False  # answer with `Prefilled.times` (the router keeps request timelines)


class PrefillTimes(msgspec.Struct, frozen=True):
    """When a prefill's steps happened on the prefill instance: seconds after it received the
    `Prefill`, on its own monotonic clock (the router places them on its own clock from when
    it sent the call and got the reply: router/request_timeline.py)."""

    handled_s: float  # the Prefill received to this reply sent
    compute_start_s: float  # the prompt's first step began
    compute_end_s: float  # its last step ended (the first token sampled)
    sent_s: float  # every KV write completed, as the sender sees it
    num_chunks: int  # steps that ran a chunk of the prompt
    # (first layer's KV written, last layer's) of the first MAX_TIMELINE_CHUNKS chunks
    chunks: Annotated[list[Interval], msgspec.Meta(max_length=MAX_TIMELINE_CHUNKS)] = []
    # per layer, in order: (its first write handed to the transport, its last write completed);
    # (-1, -1) for a layer that sent nothing (all its blocks cached on the decode instance)
    layers: Annotated[list[Interval], msgspec.Meta(max_length=MAX_TIMELINE_LAYERS)] = []


class Prefilled(Reply, tag="prefilled"):
    first_token: int
    num_cached_tokens: int  # prefix-cache hit on the prefill instance
    num_bytes: int
    compute_s: float  # prefill forward pass
    transfer_s: float  # first write issued to the sender's last completion (sender's view)
    exposed_s: float  # end of compute to the sender's last completion (sender's view)
    compute_end_at: float  # time.time() at the end of compute
    first_write_at: float  # time.time() when the first write was issued
    times: PrefillTimes | None = None  # when the Prefill asked for them (`timeline`)


class Decode(Message, tag="decode"):
    """Router -> decode: the KV is sent and the first token known; stream `TokenOutput`s, or
    answer `KVFailed` in place of the stream when the KV is not there to adopt."""

    first_token: int
    sampling: SamplingParams
    traceparent: TraceParentText | None = None  # as in Reserve


class KVLanded(Message, tag="kv_landed"):
    """Decode -> router: when the receiver saw the last byte land (a KV that will not land is
    reported by `KVFailed`)."""

    landed_at: float = 0.0  # time.time() on the decode instance
    # the adopt that followed: from the KV landed and the Decode arriving, whichever is later,
    # to the sequence queued with its first token (None: not adopted, or not measured)
    adopt_s: float | None = None
    # For the router's request timelines, seconds after the Reserve was answered, on the decode
    # instance's monotonic clock: the last byte landed, and the Decode arrived (None: not measured)
    landed_after_s: float | None = None
    ordered_after_s: float | None = None


class KVFailed(Message, tag="kv_failed"):
    """Prefill or decode -> router: the KV of this request will not land in its reservation
    (the transfer failed, the reservation's lease expired, the reservation is gone). The one
    way an instance reports a KV failure, and its whole answer for it: a `Prefill` that fails
    so gets no other reply, a `Decode` no output."""

    reason: str
    side: Literal["prefill", "decode"]  # KV_SIDE_PREFILL or KV_SIDE_DECODE: the instance that saw it


class Renew(Message, tag="renew"):
    """Prefill -> router -> decode: the prefill of this reservation progressed since the last
    renewal (computed, sent, or moved up its queue); extend the reservation's lease."""


class Generate(Message, tag="generate"):
    """Prefill and decode on one instance (colocated, or a short prompt); streams `TokenOutput`s,
    or answers one `CallError` (kind STALE_EPOCH) when refused for its epoch."""

    token_ids: list[int]
    sampling: SamplingParams
    epoch: int | None = None  # as in Reserve
    traceparent: TraceParentText | None = None  # as in Reserve


class TokenOutput(Message, tag="tokens"):
    output: RequestOutput
    failure_kind: str = ""  # for a failed output: FAILURE_SHUTDOWN, or ""


class Abort(Message, tag="abort"):
    """Drop the request wherever it is; fire-and-forget, harmless when unknown."""


class PeerLost(Message, tag="peer_lost"):
    """Router -> instances: `instance_id` is gone. `fenced`: its process can write no more
    (its connection closed: it died, or ended everything first), so blocks held for its
    writes may be reused; False while it merely stopped answering."""

    instance_id: str
    reason: str
    fenced: bool = True


class GetStats(Call, tag="get_stats"):
    settle: bool = False  # first let aborts land and running requests finish (bounded wait)


class Stats(Reply, tag="stats"):
    instance_id: str
    role: Role
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    num_blocks: int
    num_reservations: int = 0
    epoch: int = 0  # role epoch (as in Welcome)
    switching: bool = False  # draining for a role switch: it takes no new work
    num_fencing_blocks: int = 0  # blocks of dropped reservations held until no late byte can land
    num_prefilling: int = 0  # of num_running, those whose prompt is not all computed yet (EngineStats)
    num_steps: int = 0  # engine steps run since start (the dashboard's step rate)
    num_refused_reservations: int = 0  # since start: reservations refused for lack of free blocks ("busy")
    kv_tier: KVTierReport | None = None  # its use of the shared KV tier; None: it runs without one


# ---- role switch ---------------------------------------------------------------------------
class SwitchRole(Call, tag="switch_role"):
    """Router -> instance: stop taking new work, let what is in flight finish, reset the KV
    pool (prefix cache included) and serve as `role` from then on, with the role epoch bumped.
    Answered by `RoleSwitched`, or `CallError`: "invalid" (not an instance role, a bad
    `drain_timeout_s`), STALE_EPOCH (the sender's epoch is not the instance's, or another
    switch is under way) or DRAIN_TIMEOUT (in-flight work outlasted `drain_timeout_s`; the
    instance then keeps serving in its old role and epoch)."""

    role: Role
    epoch: int  # the epoch the sender saw: the switch is refused if another one happened since
    drain_timeout_s: float


class RoleSwitched(Reply, tag="role_switched"):
    role: Role
    epoch: int
    previous_role: Role
    drain_s: float  # waiting for in-flight work to finish
    reset_s: float  # resetting the pool and taking the new role
    num_drained: int  # requests that were in flight when the switch began


# ---- the KV link cap ------------------------------------------------------------------------
class SetLinkCap(Call, tag="set_link_cap"):
    """Router -> instance: cap this instance's outgoing KV bandwidth at `gbps` Gbit/s (None or
    0: uncapped) from its next KV write on. Answered by `LinkCapSet`, or `CallError` "invalid"
    (a negative or non-finite rate)."""

    gbps: float | None = None


class LinkCapSet(Reply, tag="link_cap_set"):
    gbps: float | None  # the cap now in force
    previous_gbps: float | None


class Register(Call, tag="register"):
    """Instance -> router: "I am serving at host:port"; the router connects back and handshakes."""

    host: str
    port: int


class Registered(Reply, tag="registered"):
    instance_id: str


# ---- clients of the router ---------------------------------------------------------------
class ClientGenerate(Message, tag="client_generate"):
    """Client -> router: a request by text or token ids; streams `TokenOutput`s."""

    prompt: str | None = None
    token_ids: list[int] | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    layerwise: bool | None = None  # override the router's KV streaming mode (experiments)


class ClusterStats(Reply, tag="cluster_stats"):
    """Router -> client: the last stats of every live instance."""

    instances: list[Stats]


AnyMessage = (
    Hello
    | Challenge
    | Prove
    | Welcome
    | CallError
    | Reserve
    | Reserved
    | Prefill
    | Prefilled
    | Decode
    | Generate
    | KVLanded
    | KVFailed
    | Renew
    | TokenOutput
    | Abort
    | PeerLost
    | GetStats
    | Stats
    | Register
    | Registered
    | ClientGenerate
    | ClusterStats
    | SwitchRole
    | RoleSwitched
    | SetLinkCap
    | LinkCapSet
    | Heartbeat
    | Evict
    | Draining
    | SubscribeKVEvents
    | KVEvents
)
