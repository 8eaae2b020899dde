"""A stand-in for llama-server in `bench.py peer --peer-binary` tests (CI builds no llama-server).

It takes llama-server's command line, writes what it was given (its argv, the cores it may run
on, its pid) as JSON to the file named by `PEER_STANDIN_RECORD`, and then becomes a `minipd --role
both --model tiny` server on the port it was told, so the bench measures a real server."""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.loadgen.processes import minipd_command


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-t", type=int, required=True)
    parser.add_argument("-tb", type=int, required=True)
    parser.add_argument("-np", type=int, required=True)
    parser.add_argument("-c", type=int, required=True)
    args = parser.parse_args()
    record = {"argv": sys.argv[1:], "cpus": sorted(os.sched_getaffinity(0)), "pid": os.getpid(), **vars(args)}
    with open(os.environ["PEER_STANDIN_RECORD"], "w") as f:
        json.dump(record, f)
    command = minipd_command()
    argv = [*command, "--role", "both", "--model", "tiny", "--port", str(args.port), "--torch-threads", str(args.t)]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
