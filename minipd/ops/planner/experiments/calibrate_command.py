"""Re-derive the calibration factors of the `distserve-13b-a100` profile (a few minutes).

Prints the factors that make a lone prefill instance sustain DistServe's 5.6 rps and a lone
decode instance its 10 rps; `minipd.ops.planner.experiments.distserve_example` stores them.
"""

from __future__ import annotations

import argparse

from minipd.ops.planner.experiments import distserve_example


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=distserve_example.CALIBRATION_REQUESTS)


def run(args: argparse.Namespace) -> int:
    prefill_factor, decode_factor = distserve_example.calibrate(args.num_requests)
    print(f"PREFILL_FACTOR = {prefill_factor:.4f}  (stored: {distserve_example.PREFILL_FACTOR})")
    print(f"DECODE_FACTOR = {decode_factor:.4f}  (stored: {distserve_example.DECODE_FACTOR})")
    return 0
