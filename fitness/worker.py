"""A judge kept warm for a whole search: `python -m fitness.worker`, one per device.

Reads one JSON request per line on stdin (the keyword arguments of Judge.judge_group)
and writes one JSON list of verdicts, one per path, per line on stdout. Torch is
imported, the CUDA context made, reference models loaded and reference logits cached
once for every judgement it makes.
It never imports a candidate: each runs in a runner process of its own (fitness.judge).
With --cpus it keeps itself and its runners to those cores, so judges on one machine do
not take each other's cores (a host-bound engine timed beside a busy neighbour is timed
wrong).
"""
import argparse
import json
import os
import signal
import sys

import torch

from contract.devices import is_cuda, parse_cpus
from fitness.candidate import adopt_orphans
from fitness.judge import Judge


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fitness.worker")
    parser.add_argument("--device", required=True)
    parser.add_argument("--cpus", default="", help="cores for this judge and its runners, e.g. 0-7")
    parser.add_argument("--scratch", help="where generated judging weights are kept")
    args = parser.parse_args(argv)
    threads = None
    if args.cpus:
        os.sched_setaffinity(0, parse_cpus(args.cpus))  # inherited by every runner
        threads = len(parse_cpus(args.cpus))
    if not is_cuda(args.device):
        threads = 1  # OpenMP threads waiting on each other on a busy CPU: a gate 50x slower
    if threads:
        torch.set_num_threads(threads)
    adopt_orphans()  # this process starts runners only: any other child is one a runner left
    judge = Judge(args.device, scratch=args.scratch, threads=threads)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs `finally`: runners are killed
    out = sys.stdout
    sys.stdout = sys.stderr  # stdout carries verdicts only
    try:
        for line in sys.stdin:
            out.write(json.dumps(judge.judge_group(**json.loads(line)), default=str) + "\n")
            out.flush()
    finally:
        judge.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
