"""A candidate's runner process, seen from the judge: start it, ask, time, kill.

Every request has a deadline; a runner that misses it, dies, or answers with something
that is not a message ends as a `RunnerFailure` carrying the verdict it earns (timeout or
crash) and the tail of its stderr. The process runs in a session of its own; stopping or
killing it takes every process descended from it, those it moved to sessions of their own
too, and a judge's own process (`adopt_orphans`) kills the ones whose parent left them: a
helper left spinning while other programs ran was judged 4.86x the seed, doing the seed's
work. `Spares` keeps one runner started ahead (its interpreter, torch and CUDA context
ready), so a judgement does not wait for them.
"""
import collections
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from contract.devices import is_cuda
from fitness.isolation import LIBC, PR_CAPBSET_DROP, PR_SET_DUMPABLE, SCRATCH_PREFIX, promote_kernels
from fitness.wire import DONE, NAP_S, RUN_STAGED, WAKE, Channel, Slot, WireError, WireTimeout, parse, staged

REPO_ROOT = Path(__file__).resolve().parent.parent
STDERR_TAIL = 1500
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # linux/prctl.h
CAP_SYS_PTRACE = 19  # linux/capability.h


STOP_WAIT_S = 1.0  # a runner not stopped by then is left as it is (it is dying, or traced)
STOPPED_STATES = ("T", "t", "Z", "X", "")  # stopped, traced, or gone


RUNNERS = set()  # the pids of this process's runners, alive
RUNNERS_LOCK = threading.Lock()  # a runner just started is in RUNNERS before kill_orphans looks
ADOPTS = []  # [True] once this process adopts its runners' orphans (adopt_orphans)


def children(pid: int) -> list:
    """The pids of a process's children (of each of its threads)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:  # gone
        pass
    return found


def signal_tree(pid: int, sig) -> None:
    """`sig` to a process and every process descended from it: parents first, a parent's
    children read once it has the signal (a stopped parent forks no more); for SIGKILL the
    whole tree read first (a killed parent's children go to another)."""
    if sig == signal.SIGKILL:
        tree, todo = [], [pid]
        while todo:
            tree.append(todo.pop())
            todo += children(tree[-1])
        for member in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, sig)
        return
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            os.kill(current, sig)
        except ProcessLookupError:
            continue
        todo += children(current)


def adopt_orphans() -> None:
    """This process (a judge's own: the worker, `fitness judge`) becomes the parent of every
    process its runners' children leave behind (Linux's child subreaper), and
    `kill_orphans` ends them: a helper forked twice has no other parent to be found by."""
    LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1)
    ADOPTS[:] = [True]


def kill_orphans() -> None:
    """Every child of this process but its runners, and what descends from it, killed and
    reaped: in a process that adopts orphans, no other child is its own."""
    if not ADOPTS:
        return
    with RUNNERS_LOCK:
        orphans = [child for child in children(os.getpid()) if child not in RUNNERS]
    for child in orphans:
        signal_tree(child, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)


def process_state(pid: int) -> str:
    """The state letter /proc gives a process ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class RunnerFailure(Exception):
    """The runner failed a request: `status` is the verdict it earns."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def no_answer(timeout: float) -> str:
    """A timeout's words: a request waits for what is left of its judgement's time, so a
    request made late (one of many runners starved at once) reads 0 s."""
    return f"no answer in the {max(timeout, 0):.0f} s left of the judgement's time (its --timeout)"


class CandidateError(Exception):
    """The candidate's own code raised inside the runner (the runner itself is fine)."""


class CandidateProcess:
    def __init__(self, device: str, env: dict | None = None):
        self.device = device
        closed_to_runners()
        to_runner, self.write_fd = os.pipe()
        self.read_fd, from_runner = os.pipe()
        self.slot = Slot()
        self.stderr = tempfile.TemporaryFile()
        remove_left_scratch()
        # The one folder it may write (fitness.isolation), named by this judge's pid.
        self.scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        child_env = {**os.environ, **(env or {}), "JUDGE_DEVICE": device, "RUNNER_SCRATCH": self.scratch}
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
        limit = cpu_memory_limit() if not is_cuda(device) else None
        with RUNNERS_LOCK:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fitness.isolation", "fitness.runner", str(to_runner), str(from_runner),
                 str(self.slot.fd)],
                pass_fds=(to_runner, from_runner, self.slot.fd), stdin=subprocess.DEVNULL, stdout=self.stderr,
                stderr=self.stderr, env=child_env, cwd=self.scratch, start_new_session=True,
                preexec_fn=lambda: start_runner(limit))
            RUNNERS.add(self.proc.pid)
        os.close(to_runner)
        os.close(from_runner)
        self.channel = Channel(self.read_fd, self.write_fd)
        self.closed = self.is_ready = False
        self.open_layers = ""  # what fitness.isolation could not close, as the runner's first message says
        self.vouched = None  # whether every program it loaded was one its caller vouched for (None: none loaded)
        self.spent = collections.Counter()  # seconds per request kind, on the judge's clock

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the runner has imported torch (and made its CUDA context)."""
        if not self.is_ready:
            started = time.monotonic()
            header, _ = self.answer("start", started + timeout, timeout)
            self.open_layers = str(header.get("open_layers", ""))
            warn_open_once(self.open_layers)
            self.is_ready = True
            self.spent["start"] += time.monotonic() - started

    def loaded(self, vouched: bool) -> None:
        """It runs a program now; `vouched`: its caller vouched for that program's code."""
        self.vouched = vouched and self.vouched is not False

    def request(self, op: str, timeout: float, **fields) -> tuple[dict, list]:
        """Send one request and wait for its answer; CandidateError if the candidate raised."""
        return self.send(op, timeout, **fields)()

    def send(self, op: str, timeout: float, *, awake: bool = False, **fields):
        """Send one request; returns the wait for its answer, so that several runners can
        work at once (on what is not timed) while the judge waits on each in turn. An
        `awake` wait polls without sleeping: no wake-up latency lands on the judge's clock."""
        self.wait_ready(timeout)
        started = time.monotonic()
        deadline = started + max(timeout, 0.0)
        try:
            self.channel.send({"op": op, **fields})
        except OSError as err:
            raise RunnerFailure("crash", f"{op}: {err}; {self.exit_status()}{self.tail()}") from None

        def wait() -> tuple[dict, list]:
            try:
                return self.answer(op, deadline, timeout, awake=awake)
            finally:
                self.spent[op] += time.monotonic() - started
        return wait

    def pause(self) -> None:
        """Stop the runner's whole session (SIGSTOP) while another program runs: a
        neighbour cannot slow it down by working behind its back. Returns once the runner
        has stopped (a signal arrives when the kernel next schedules it: seen on 2 cores, a
        run began while its neighbour was still running)."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + STOP_WAIT_S
        while process_state(self.proc.pid) not in STOPPED_STATES and time.monotonic() < deadline:
            time.sleep(0)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def signal(self, sig) -> None:
        """`sig` to the runner's session, and to every process descended from it (one may
        have left the session: it is stopped and killed with the runner all the same)."""
        signal_tree(self.proc.pid, sig)
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # it died; the next request says how
            pass

    def answer(self, op: str, deadline: float, timeout: float, awake: bool = False) -> tuple[dict, list]:
        spin_s = max(deadline - time.monotonic(), 0.0) if awake else 0.0
        try:
            header, tensors = self.channel.receive(deadline, spin_s=spin_s)
        except WireTimeout:
            raise RunnerFailure("timeout", f"{op}: {no_answer(timeout)}{self.tail()}") from None
        except (WireError, OSError) as err:
            raise RunnerFailure("crash", f"{op}: {err}; {self.exit_status()}{self.tail()}") from None
        if not header.get("ok"):
            raise CandidateError(str(header.get("error", "no error text")))
        return header, tensors

    def timed_run(self, planned: list, timeout: float, awake: bool = False) -> tuple[float, int]:
        """(seconds, checksum) of the run that follows `prepare`: the runner woken (`WAKE`),
        then, on the clock, each planned call (`Slot.plan`, made ahead) sent once the runner
        has answered the one before, then `end`. The clock is this process's, read around
        the whole run, so nothing the candidate does to clocks or synchronisation counts.
        Not `awake` (a CPU), the wait naps between looks."""
        deadline = time.monotonic() + max(timeout, 0.0)
        alive = lambda: self.proc.poll() is None  # noqa: E731
        nap_s = 0.0 if awake else NAP_S
        woken = time.perf_counter()
        try:
            with self.wire_failures("run", timeout):
                self.slot.calls.put(WAKE)
                if self.slot.answers.take(deadline, alive, nap_s) != DONE:
                    raise WireError("the runner did not answer before its run")
                started = time.perf_counter()
                for call in planned:
                    self.slot.send(*call)
                    answer = self.slot.answers.take(deadline, alive, nap_s)
                    if answer != DONE:
                        break
                seconds = time.perf_counter() - started
                header, _ = parse(answer)
        finally:
            self.spent["run"] += time.perf_counter() - woken
        if not header.get("ok") or "checksum" not in header:
            raise CandidateError(str(header.get("error", "no error text")))
        return seconds, int(header["checksum"])

    def staged_run(self, planned: list, timeout: float, awake: bool = False) -> tuple[float, int]:
        """timed_run of a run whose calls were all staged first (off the clock, each call's
        values and header sent and answered in turn), then made by one `run_staged`: the
        evaluator's protocol, every input there before its clock."""
        deadline = time.monotonic() + max(timeout, 0.0)
        alive = lambda: self.proc.poll() is None  # noqa: E731
        started = time.perf_counter()
        try:
            with self.wire_failures("staging", timeout):
                for payload, start, values in planned[:-1]:
                    self.slot.send(staged(payload), start, values)
                    answer = self.slot.answers.take(deadline, alive, 0.0 if awake else NAP_S)
                    if answer != DONE:
                        header, _ = parse(answer)
                        raise CandidateError(str(header.get("error", "no error text")))
        finally:
            self.spent["stage"] += time.perf_counter() - started
        return self.timed_run([(RUN_STAGED, 0, None), planned[-1]], deadline - time.monotonic(), awake)

    @contextlib.contextmanager
    def wire_failures(self, what: str, timeout: float):
        """The slot's errors as the runner's failure: a timeout, or a crash with its exit status."""
        try:
            yield
        except WireTimeout:
            raise RunnerFailure("timeout", f"{what}: {no_answer(timeout)}{self.tail()}") from None
        except WireError as err:
            raise RunnerFailure("crash", f"{what}: {err}; {self.exit_status()}{self.tail()}") from None

    def exit_status(self) -> str:
        try:
            code = self.proc.wait(timeout=2.0)  # its pipe closed: it is exiting, or closed it itself
        except subprocess.TimeoutExpired:
            return "the runner is still alive"
        if code < 0:
            return f"the runner was killed by {signal.Signals(-code).name}"
        return f"the runner exited {code}"

    def tail(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")[-STDERR_TAIL:]
        return f"\n{text}" if text.strip() else ""

    def close(self) -> None:
        """Kill the runner's whole session, now."""
        if self.closed:
            return
        self.closed = True
        self.signal(signal.SIGKILL)
        self.proc.wait()
        RUNNERS.discard(self.proc.pid)
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.slot.close()
        self.stderr.close()
        if self.vouched:  # an unvouched program could plant a kernel under a key a rival compiles later
            promote_kernels(self.scratch)
        shutil.rmtree(self.scratch, ignore_errors=True)


class Spares:
    """One runner started ahead of need; `take_many` hands it over and starts the next.
    `ahead=False` (a judge that judges once): none started ahead, whose torch import would
    only take a core from the judgement and be thrown away."""

    def __init__(self, device: str, env: dict | None = None, ahead: bool = True):
        self.device, self.env, self.ahead = device, env, ahead
        self.ready = None

    def take_many(self, count: int) -> list:
        """`count` runners: the one started ahead, and the others started now (at once);
        then the next spare."""
        runners = []
        if count and self.ready is not None:
            if self.ready.proc.poll() is None:
                runners.append(self.ready)
            else:
                self.ready.close()
            self.ready = None
        runners += [CandidateProcess(self.device, self.env) for _ in range(count - len(runners))]
        if self.ahead:
            self.ready = CandidateProcess(self.device, self.env)
        return runners

    def settle(self) -> None:
        """Wait until the spare has started: a process importing torch beside a timed run
        would slow a host-bound engine down."""
        if self.ready is not None:
            try:
                self.ready.wait_ready()
            except (RunnerFailure, CandidateError):
                self.ready.close()
                self.ready = None

    def close(self) -> None:
        if self.ready is not None:
            self.ready.close()
            self.ready = None


SWEPT = []  # [True] once this process removed the scratch folders dead judges left


def remove_left_scratch() -> None:
    """Once a process: the runners' scratch folders (their compiled kernels among them) that a
    judge killed before it could close its runners left behind, found by their judge's pid."""
    if SWEPT:
        return
    SWEPT.append(True)
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        judge_pid = folder.name[len(SCRATCH_PREFIX):].split("-")[0]
        if judge_pid.isdigit() and not Path(f"/proc/{judge_pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


WARNED = []  # the open layers this process warned of


def warn_open_once(open_layers: str) -> None:
    """A runner that could not be closed off entirely (fitness.isolation) is said once."""
    if open_layers and open_layers not in WARNED:
        WARNED.append(open_layers)
        print(f"warning: candidates run with these defences missing: {open_layers} (fitness/isolation.py)",
              file=sys.stderr)


def closed_to_runners() -> None:
    """This process's memory closed to its runners: it holds a run's tokens before the run,
    and a runner of the same user (root, on the GPU machines) could read them through
    /proc/<judge>/mem. Not dumpable, it may be read only with CAP_SYS_PTRACE, which a
    runner is started without (`start_runner`)."""
    LIBC.prctl(PR_SET_DUMPABLE, 0)


def start_runner(memory_limit: int | None) -> None:
    """In the runner, before it starts: die with the judge (a runner left behind by a
    killed judge would hold its GPU), give up CAP_SYS_PTRACE (it could read the judge's
    memory; unprivileged, it never had it) and cap a CPU runner's memory."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    LIBC.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))


def cpu_memory_limit() -> int:
    """Address space a CPU runner may take: half the machine's memory. A candidate that
    asks for more fails its own allocation (a crash verdict) instead of waking the kernel's
    OOM killer, which picks its victim machine-wide (seen: 24 GB by one slab-cache child).
    Not for CUDA runners: the driver reserves far more address space than it uses."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
