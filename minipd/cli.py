"""The `minipd` command: one binary, the role chosen by `--role`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

ROLES = {
    "both": "colocated instance: prefill and decode on one engine, with chunked prefill (the baseline)",
    "prefill": "prefill instance: computes prompts and streams their KV to decode instances, layer by layer",
    "decode": "decode instance: reserves blocks, receives the KV, decodes in continuous batches",
    "router": "router: picks instances, reserves before prefill, relays tokens (the KV never passes through it)",
    "cluster": "launcher: a router plus N prefill and M decode instances as processes on this host",
}

DESCRIPTION = """minipd: a small prefill/decode disaggregated LLM serving engine.

Roles:
""" + "\n".join(f"  {name:8} {text}" for name, text in ROLES.items()) + """

`minipd --role ROLE --help` lists the flags of that role."""


def _role_parser(role: str | None) -> argparse.ArgumentParser:
    from .engine_args import add_engine_arguments
    from .roles import add_instance_arguments, add_router_arguments, add_router_policy_arguments

    parser = argparse.ArgumentParser(prog="minipd", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", required=True, choices=list(ROLES), help="what this process runs")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging verbosity (default: %(default)s)")
    if role is None:
        return parser
    if role == "router":
        parser.add_argument("--model", default="tiny",
                            help="preset, packaged model, .gguf file or HF directory whose tokenizer the router "
                                 "uses (no weights are loaded); must match the instances' (default: %(default)s)")
        add_router_arguments(parser)
        _add_router_http_arguments(parser)
        return parser
    add_engine_arguments(parser)
    if role == "both":
        _add_http_arguments(parser)
        _add_demo_arguments(parser)
    elif role in ("prefill", "decode"):
        add_instance_arguments(parser)
    elif role == "cluster":
        from .local_cluster import add_cluster_arguments

        add_cluster_arguments(parser)
        add_router_policy_arguments(parser)
        _add_router_http_arguments(parser)
        _add_demo_arguments(parser, what="send these prompts to the cluster, print the results and shut down; "
                                         "without any, serve until Ctrl-C")
    return parser


def _add_http_arguments(parser: argparse.ArgumentParser) -> None:
    from .http_server import DEFAULT_HOST, DEFAULT_MAX_WAITING_REQUESTS

    g = parser.add_argument_group("OpenAI-compatible HTTP API (served when --port is given)")
    g.add_argument("--port", type=int, default=None,
                   help="serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics on this "
                        "port instead of running the local prompt demo; 0 picks a free port, announced on stdout")
    g.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default: %(default)s)")
    g.add_argument("--served-model-name", default=None,
                   help="the model id clients pass as `model` (default: the --model value)")
    g.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
                   help="answer 503 with Retry-After while this many requests wait already (default: %(default)s)")


def _add_router_http_arguments(parser: argparse.ArgumentParser) -> None:
    """The router's OpenAI front (`--http-port`, ...), started by `roles.run_router`."""
    from .http_front import add_router_http_arguments

    add_router_http_arguments(parser)


def _add_demo_arguments(parser: argparse.ArgumentParser, what: str | None = None) -> None:
    g = parser.add_argument_group("prompts in, tokens and latencies out")
    g.add_argument("--prompt", action="append", default=[],
                   help=what or ("a prompt to answer; repeat for several (they run batched). Without any, "
                                 "prompts are read one per line from standard input"))
    g.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy (default: %(default)s)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 disables (default: 0)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--chat", action="store_true",
                   help="send each prompt as a user message through the model's chat template (instruct models "
                        "such as smollm2 answer questions that way)")


def _role_of(argv: list[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--role", choices=list(ROLES))
    known, _ = pre.parse_known_args(argv)
    return known.role


def _demo_params(args: argparse.Namespace):
    from .sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    params.validate(vocab_size=2**31)  # token-id fields are checked against the model later
    return params


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        role = _role_of(argv)
    except SystemExit as exc:  # an unknown role: show the full usage
        _role_parser(None).parse_args(argv)
        return int(exc.code or 2)
    parser = _role_parser(role)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "torch_threads", None):
        import torch
        torch.set_num_threads(args.torch_threads)
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency, but a plain asyncio loop works too
        uvloop = None
    runner = uvloop.run if uvloop else asyncio.run
    try:
        job = _job(role, args)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return runner(job)


def _job(role: str, args: argparse.Namespace):
    """Validate everything the role needs (ValueError names the flag) and return its coroutine."""
    from . import roles
    from .engine_args import engine_config_from_args

    if role == "router":
        from .model_loader import load_tokenizer_only

        load_tokenizer_only(args.model)
        return roles.run_router(args)
    config = engine_config_from_args(args)
    if role == "cluster":
        from .local_cluster import run_cluster

        for flag in ("num_prefill", "num_decode"):
            if getattr(args, flag) < 0:
                raise ValueError(f"{flag}: must be >= 0")
        if args.num_decode < 1:
            raise ValueError("num_decode: a cluster needs at least one decode instance")
        from .model_loader import load_tokenizer_only

        tokenizer = load_tokenizer_only(args.model)
        from .http_front import router_http_argv, router_http_config

        if args.http_port is not None:
            router_http_config(args)
        from .local_demo import chat_wrapper

        return run_cluster(args, roles.router_policy_argv(args) + router_http_argv(args), args.prompt,
                           _demo_params(args), chat_wrapper(tokenizer) if args.chat else None)
    if role in ("prefill", "decode"):
        if role == "prefill":
            from .inprocess_cluster import prefill_engine_config

            config = prefill_engine_config(config)
        return roles.run_instance(role, args, _load_engine(role, config))
    params = _demo_params(args)
    http_config = _http_config_from_args(args)
    engine = _load_engine(role, config)
    if http_config is not None:
        from .http_server import serve_engine

        return serve_engine(engine, args.served_model_name or args.model, http_config)
    from .local_demo import run_demo

    return run_demo(engine, args.prompt, params, chat=args.chat)


def _load_engine(role: str, config):
    """Build the engine and say on stderr which model and dtype it serves, and why that dtype."""
    import time

    from .engine import Engine

    start = time.perf_counter()
    engine = Engine(config)
    print(f"minipd {role}: model {config.model} loaded in {time.perf_counter() - start:.1f} s, "
          f"{engine.dtype_choice.describe()}", file=sys.stderr, flush=True)
    return engine


def _http_config_from_args(args: argparse.Namespace):
    """The HTTP front's config when `--port` is given, else None (run the local demo)."""
    if args.port is None:
        return None
    from .http_server import HttpConfig

    config = HttpConfig(host=args.host, port=args.port, max_waiting_requests=args.max_waiting_requests)
    config.validate()
    return config


if __name__ == "__main__":
    sys.exit(main())
