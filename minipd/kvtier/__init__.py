"""The shared KV tier: a store outside the instances (Mooncake Store, Redis) where a prefix's KV
blocks, computed once anywhere, can be fetched by any instance. Start at `tier.KVTier` (the
contract), `keys` (what names a block) and `block_header` (what proves a fetched value is the
block it claims to be); `open_tier.open_kv_tier` opens one by URL.

Imports nothing of minipd: a tier knows bytes, buffers and keys, never requests or schedulers
(docs/kv-tier.md)."""
