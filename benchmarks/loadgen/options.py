"""Command-line flags shared by the serving experiments, and what they build.

Workloads come from `minipd.ops.workload` (named shapes or a ShareGPT file, fixed seeds); SLOs use
`vllm bench serve --goodput` syntax; server flags say how to start minipd processes when no
`--url` is given.
"""

from __future__ import annotations

import argparse

from benchmarks.loadgen.deployments import ServerOptions
from benchmarks.loadgen.tokenizer_source import prompt_tokens
from contracts.strict_openai import strict_completion_chunk
from minipd.ops.loadgen.prompts import PromptBuilder
from minipd.ops.loadgen.runner import DEFAULT_REQUEST_TIMEOUT_S, RunnerConfig
from minipd.ops.workload import WORKLOADS, ArrivalProcess, LengthDist, RequestSpec, load_sharegpt, make_workload
from minipd.slo.targets import SLO

BLOCK_ALIGN = 16  # max_model_len is rounded up to whole KV blocks
SPECIAL_TOKENS_MARGIN = 8  # room for BOS and the like beyond the requested prompt length
UNLIMITED_LEN = 1 << 20


def _length(text: str) -> LengthDist:
    try:
        return LengthDist.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_workload_arguments(
    parser: argparse.ArgumentParser, default_workload: str = "prefill-heavy", with_rate: bool = True
) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--workload",
        default=default_workload,
        choices=WORKLOADS,
        help="named workload of minipd.ops.workload (default: %(default)s)",
    )
    g.add_argument(
        "--prompt-len",
        type=_length,
        default=None,
        metavar="DIST",
        help="prompt tokens: fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI] (default: the workload's)",
    )
    g.add_argument(
        "--output-len",
        type=_length,
        default=None,
        metavar="DIST",
        help="output tokens, same syntax (default: the workload's)",
    )
    g.add_argument(
        "--dataset",
        default=None,
        metavar="FILE",
        help="ShareGPT-style JSON file: prompts and output lengths from its conversations instead",
    )
    g.add_argument("--num-prompts", type=int, default=None, help="requests per run")
    g.add_argument("--seed", type=int, default=0, help="workload and prompt seed (default: %(default)s)")
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the inter-arrival gaps: 1 is Poisson, lower is burstier (default: 1)",
    )
    if with_rate:
        g.add_argument("--request-rate", type=float, default=None, help="requests per second (Poisson/gamma)")
        g.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="keep this many requests in flight instead of arriving at a rate",
        )
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer prompts are measured with: 'bytes', a checkpoint directory, a .gguf file or "
        "'smollm2' (default: resolved from --model)",
    )


def add_slo_arguments(
    parser: argparse.ArgumentParser,
    flag: str = "--goodput",
    default: list[str] | None = None,
    help_text: str | None = None,
) -> None:
    parser.add_argument(
        flag,
        nargs="+",
        default=default,
        metavar="KEY:MS",
        help=help_text or "SLO of a good request, as vllm bench serve takes it: ttft:MS tpot:MS itl:MS e2el:MS",
    )


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("client")
    g.add_argument("--num-warmup", type=int, default=1, help="warm-up requests per endpoint, not measured")
    g.add_argument(
        "--request-timeout-s",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="a request still running after this long fails (default: %(default)s)",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--quick", action="store_true", help="a short smoke run (tiny model, few requests): seconds")
    g.add_argument(
        "--max-foreign-cpu",
        type=float,
        default=None,
        metavar="FRACTION",
        help="repeat a run during which other jobs took more than this share of the machine, once they "
        "calm down (default: never; every run records the share it saw)",
    )
    g.add_argument("--quiet-wait-s", type=float, default=600.0, help="longest wait for a calmer machine")
    g.add_argument("--max-reruns", type=int, default=3, help="repeats of a disturbed run at most")


def add_server_arguments(parser: argparse.ArgumentParser, default_model: str = "small") -> None:
    g = parser.add_argument_group("servers started by the bench (flags of every minipd instance)")
    g.add_argument(
        "--model",
        default=default_model,
        help="--model of the instances, and what prompts are tokenized for (default: %(default)s)",
    )
    g.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="compute threads per instance; 1 gives each instance one core of a small host (default: %(default)s)",
    )
    g.add_argument("--max-model-len", type=int, default=None, help="(default: fits the workload)")
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks per instance (default: minipd's)")
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget of one engine step, i.e. the prefill chunk (default: minipd's)",
    )
    g.add_argument("--transport", default="tcp", help="KV transport between instances (default: %(default)s)")
    g.add_argument(
        "--server-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every instance, e.g. --server-flag=--no-prefix-caching (repeatable)",
    )


def runner_config(args: argparse.Namespace, concurrency: int | None = None) -> RunnerConfig:
    return RunnerConfig(
        num_warmup=args.num_warmup,
        request_timeout_s=args.request_timeout_s,
        progress=args.progress,
        concurrency=concurrency,
        max_foreign_cpu=args.max_foreign_cpu,
        quiet_wait_s=args.quiet_wait_s,
        max_reruns=args.max_reruns,
        parse_chunk=strict_completion_chunk,
    )


def slo_from(items: list[str] | None) -> SLO:
    return SLO.parse(items or [])


def arrivals(args: argparse.Namespace, rate: float | None = None) -> ArrivalProcess:
    concurrency = getattr(args, "concurrency", None)
    if concurrency:
        return ArrivalProcess.fixed_concurrency(concurrency)
    rate = rate if rate is not None else args.request_rate
    if rate is None:
        raise ValueError("request_rate: give --request-rate or --concurrency")
    return ArrivalProcess.poisson(rate) if args.burstiness == 1.0 else ArrivalProcess.gamma(rate, args.burstiness)


def prompt_builder(args: argparse.Namespace) -> PromptBuilder:
    return PromptBuilder(prompt_tokens(args.model, args.tokenizer), seed=args.seed)


def workload(
    args: argparse.Namespace, process: ArrivalProcess, num_requests: int, builder: PromptBuilder, seed_offset: int = 0
) -> list[RequestSpec]:
    """The requests of one run; `seed_offset` varies them between the runs of one experiment."""
    seed = args.seed + seed_offset
    if args.dataset:
        max_len = args.max_model_len - SPECIAL_TOKENS_MARGIN if args.max_model_len else UNLIMITED_LEN
        return load_sharegpt(args.dataset, num_requests, process, builder.count, seed=seed, max_prompt_len=max_len)
    return make_workload(
        args.workload, num_requests, process, seed=seed, prompt_len=args.prompt_len, output_len=args.output_len
    )


def fitting_max_model_len(specs: list[RequestSpec]) -> int:
    """The smallest block-aligned context that holds every request of `specs`."""
    longest = max(spec.prompt_len + spec.output_len for spec in specs) + SPECIAL_TOKENS_MARGIN
    return -(-longest // BLOCK_ALIGN) * BLOCK_ALIGN


def server_options(args: argparse.Namespace, specs: list[RequestSpec]) -> ServerOptions:
    return ServerOptions(
        model=args.model,
        torch_threads=args.torch_threads,
        max_model_len=args.max_model_len or fitting_max_model_len(specs),
        num_blocks=args.num_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        transport=args.transport,
        extra_flags=tuple(args.server_flag),
    )
