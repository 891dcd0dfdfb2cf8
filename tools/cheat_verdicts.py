"""The judge's verdict on every cheat of fitness/adversaries/cheats.py, beside the honest program each
was made from (the seed), one line a program.

    python -m tools.cheat_verdicts [--judge-root DIR] [--device cpu|cuda] [--bench public|small]
                                   [--only NAME ...] [--json OUT]

Each program is judged by `python -m fitness judge` run from a copy of `--judge-root`'s
packages (default: this repository; another checkout judges with its own judge, for a
before-and-after; a copy, since one cheat rewrites the judge's code), beside the
seed as baseline, on a copy of the repository's toy model of its own (one cheat rewrites
the weights it is given) and a copy of typing_extensions (one rewrites a library every runner
imports), its gate's target stage only. Each cheat sits in a folder of its
own beside a copy of the seed, its baseline, as a search keeps every program in one folder
(one cheat rewrites the other engine files there). A cheat is caught when it is not
`ok`, or runs at its real speed: its ratio to the seed near 1, and when no kernel it planted
joined the kernel cache later runners read (a cache of each judgement's own).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import typing_extensions

from contract.loader import SEED_ENGINE
from fitness import own_code
from fitness.adversaries import cheats

REPO = Path(__file__).resolve().parents[1]


def judged(path: Path, root: Path, device: str, bench: str, seed_path: Path) -> dict:
    weights = Path(tempfile.mkdtemp(prefix="weights_"))
    shutil.copy(REPO / "target" / "weights" / "model.pt", weights / "model.pt")
    judge = Path(tempfile.mkdtemp(prefix="judge_"))
    for package in own_code.PACKAGES:
        if (root / package).is_dir():
            shutil.copytree(root / package, judge / package, ignore=shutil.ignore_patterns("__pycache__", "weights"))
    shutil.copy(typing_extensions.__file__, judge)  # the library one cheat rewrites: a copy, found first
    command = [sys.executable, "-m", "fitness", "judge", str(path), "--model-config",
               str(REPO / "target" / "model_config.json"), "--weight-dir", str(weights),
               "--device", device, "--bench", bench, "--baseline", str(seed_path), "--no-derived",
               "--rounds", "2", "--max-rounds", "3", "--timeout", "900"]
    kernels = Path(tempfile.mkdtemp(prefix="kernels_"))  # a kernel cache of its own: one cheat plants a kernel
    done = subprocess.run(command, cwd=judge, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(judge), "TRITON_CACHE_DIR": str(kernels)})
    planted = (kernels / cheats.PLANTED_KEY).exists()
    for folder in (weights, judge, kernels):
        shutil.rmtree(folder)
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        verdict = {"status": "no verdict", "error": (done.stderr or done.stdout)[-300:]}
    return {**verdict, "planted_kernel_shared": planted}


def line(name: str, verdict: dict) -> str:
    tokens = verdict.get("tokens_per_second") or {}
    speed = " ".join(f"{case} {value:,.0f}" for case, value in tokens.items())
    ratio = verdict.get("ratio")
    error = " ".join(str(verdict.get("error", "")).split())[:110]
    return (f"{name:28s} {verdict.get('status', '?'):10s} {verdict.get('stage', ''):7s} "
            f"ratio {ratio if ratio is None else round(ratio, 3)!s:6s} {speed}  {verdict.get('seconds', '')} s"
            + (f"  [{error}]" if error else "")
            + ("  [its planted kernel joined the shared cache]" if verdict.get("planted_kernel_shared") else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cheat_verdicts", description=__doc__.splitlines()[0])
    parser.add_argument("--judge-root", type=Path, default=REPO)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bench", default="small")
    parser.add_argument("--only", nargs="*", default=list(cheats.CHEATS))
    parser.add_argument("--json", type=Path, help="write every verdict here")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="cheats_"))
    verdicts = {}
    for name in ["seed (honest)"] + args.only:
        folder = directory / name.split()[0]
        baseline = folder / "baseline.py"
        path = SEED_ENGINE if name.startswith("seed") else cheats.write_cheat(name, folder)
        folder.mkdir(parents=True, exist_ok=True)
        baseline.write_text(SEED_ENGINE.read_text())
        verdicts[name] = judged(path, args.judge_root.resolve(), args.device, args.bench, baseline)
        print(line(name, verdicts[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(verdicts, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
