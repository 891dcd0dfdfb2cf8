"""The GPU machine's drivers (tools/gpu/*.sh) are read on the CPU: each parses, and the
job queue exports every function its jobs call. A queue runs its jobs in a fresh `bash -c`
under setsid, which sees only exported functions: `hf_compare` was not, and a 20-minute
search's comparison ended at once with "command not found" on the GPU."""
import re
import subprocess
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parent.parent / "tools" / "gpu"


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_each_driver_parses(script):
    subprocess.run(["bash", "-n", str(GPU / script)], check=True)


def test_the_queue_exports_every_function_its_jobs_call():
    queue = (GPU / "queue.sh").read_text()
    defined = set()
    for text in (queue, (GPU / "bench_rounds.sh").read_text()):
        defined |= set(re.findall(r"^([a-z_]+)\(\) \{", text, re.MULTILINE))
    exported = set(re.search(r"^export -f (.+)$", queue, re.MULTILINE).group(1).split())
    assert {"queue", "run_job", "hf_compare"} <= defined
    assert defined <= exported, defined - exported
