"""fitness.isolation: what a closed-off runner can still reach, and the kernel cache it shares."""
import json
import os
import subprocess
import sys


from fitness import isolation
from tests.conftest import REPO, closed_off_here

PROBE = '''import json, os
def attempt(action):
    try:
        action()
        return "done"
    except OSError as err:
        return err.strerror
scratch = os.environ["RUNNER_SCRATCH"]
print(json.dumps({
    "write the repository": attempt(lambda: open(os.path.join(REPO, "written_by_a_runner"), "w")),
    "write its scratch": attempt(lambda: open(os.path.join(scratch, "mine"), "w")),
    "signal its parent": attempt(lambda: os.kill(os.getppid(), 0)),
    "signal itself": attempt(lambda: os.kill(os.getpid(), 0)),
    "renice its parent": attempt(lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 5)),
    "pin its parent": attempt(lambda: os.sched_setaffinity(os.getppid(), {0})),
    "a namespace of its own": attempt(lambda: os.unshare(os.CLONE_NEWUSER)) if hasattr(os, "unshare") else "n/a",
    "capabilities": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
}))
'''


def closed_off(tmp_path, probe: str, **env) -> dict:
    """What `probe` (module code printing JSON) prints, run in a runner closed off."""
    closed_off_here()
    (tmp_path / "probe.py").write_text(f"REPO = {str(REPO)!r}\n" + probe)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "fitness.isolation", "probe"], capture_output=True, text=True,
                          timeout=60, cwd=scratch, env={**os.environ, "RUNNER_SCRATCH": str(scratch), **env,
                                                        "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_closed_off_runner_writes_only_its_scratch_and_signals_only_itself(tmp_path):
    seen = closed_off(tmp_path, PROBE)
    assert seen.pop("write the repository") == "Read-only file system"
    assert seen.pop("capabilities") == "0000000000000000"
    assert seen.pop("a namespace of its own") in ("Operation not permitted", "n/a")
    assert seen == {"write its scratch": "done", "signal its parent": "Operation not permitted",
                    "signal itself": "done", "renice its parent": "Operation not permitted",
                    "pin its parent": "Operation not permitted"}
    assert not (REPO / "written_by_a_runner").exists()


def test_without_the_shared_kernel_cache_a_runner_compiles_into_its_own_and_says_so(tmp_path):
    """Where the overlay cannot be made (here: Triton's cache folder under a file), the runner
    still closes the rest and names what it went without."""
    (tmp_path / "a_file").write_text("")
    seen = closed_off(tmp_path, "import json, os\nprint(json.dumps([os.environ[k] for k in (\"RUNNER_OPEN_LAYERS\", "
                                "\"TRITON_CACHE_DIR\")] + [os.access(REPO, os.W_OK)]))",
                      TRITON_CACHE_DIR=str(tmp_path / "a_file" / "cache"))
    open_layers, cache, repo_writable = seen
    assert open_layers.startswith("the shared kernel cache (each runner compiles into ") and "kernels/own" in cache
    assert not repo_writable


def test_a_runners_new_kernels_join_the_shared_cache_and_replace_none(tmp_path, monkeypatch):
    known, fresh, linked = "K" * 52, "F" * 52, "L" * 52  # Triton 3 names a kernel's folder so
    shared, scratch = tmp_path / "cache", tmp_path / "scratch"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))
    new = scratch / "kernels" / "new"
    (shared / known).mkdir(parents=True)
    (shared / known / "k.cubin").write_bytes(b"compiled before")
    for key, content in ((known, b"planted"), (fresh, b"compiled here"), (".not-a-key", b"?")):
        (new / key).mkdir(parents=True)
        (new / key / "k.cubin").write_bytes(content)
    (new / linked).mkdir()
    (new / linked / "k.cubin").symlink_to(shared / known / "k.cubin")
    isolation.promote_kernels(str(scratch))
    assert (shared / known / "k.cubin").read_bytes() == b"compiled before"  # never replaced
    assert (shared / fresh / "k.cubin").read_bytes() == b"compiled here"
    # No link, no folder named as no key is, no staging folder left.
    assert sorted(p.name for p in shared.iterdir()) == [fresh, known]


def test_scratch_a_killed_judge_left_is_removed_once_its_judge_is_gone(tmp_path, monkeypatch):
    from fitness import candidate
    monkeypatch.setattr(candidate.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(candidate, "SWEPT", [])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left, alive = tmp_path / f"runner-{int(gone.stdout)}-abc", tmp_path / f"runner-{os.getpid()}-abc"
    for folder in (left, alive):
        (folder / "kernels").mkdir(parents=True)
    candidate.remove_left_scratch()
    assert not left.exists() and alive.exists()
