"""A runner closed off before its candidate's code runs, then the runner itself:

    python -m fitness.isolation fitness.runner ARGS...     (started by fitness.candidate)

A candidate runs as its judge's user (root on the GPU machines). Unfenced, it can write any
file that user can (a library every later runner imports, a rival's Triton cache, the
judge's code) and signal, renice or pin any process of that user (a rival runner killed
mid-judgement is judged `crash`). Each hole was closed where it was found
(fitness/README.md); this closes the classes, in a process still alone (no thread yet):

- **files**: a mount namespace of its own where every filesystem is read-only but the
  runner's scratch folder (its TMPDIR, its CUDA cache), its own /proc/<pid>, the folders
  the judge names in RUNNER_WRITABLE (the tests' probes), a /dev/shm of its own, and
  Triton's kernel cache seen through an overlay (the kernels compiled before read, its own
  written to its scratch and added to the shared cache by the judge when it is gone, never
  replacing one, and only when its caller vouched for the code of every program it ran: a
  program could plant a kernel under a key a rival compiles later);
- **other processes**: a seccomp filter refuses (EPERM) every signal, scheduling, priority,
  resource-limit, trace and namespace call aimed at a process other than the runner itself;
- **the way back**: every capability given up (none can mount, unmount or remount again),
  not dumpable (a sibling runner cannot read or trace it), no new privileges.

Where a layer cannot be had (no right to make a mount namespace, another architecture's
system calls) the runner goes on without it and says which in its first message
(`open_layers`, through RUNNER_OPEN_LAYERS); the judge warns once. RUNNER_ISOLATION=off (in
the judge's environment, which a candidate cannot reach) starts runners open, as the tests
of the older defences need.
"""
import ctypes
import json
import os
import platform
import re
import runpy
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

LIBC = ctypes.CDLL(None, use_errno=True)
SCRATCH_PREFIX = "runner-"  # a runner's scratch folder: runner-<its judge's pid>-... (fitness.candidate)

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
NAMESPACES = 0x02000000 | 0x04000000 | 0x08000000 | CLONE_NEWUSER | 0x20000000 | 0x40000000 | CLONE_NEWNS
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 24, 22, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
CAPABILITY_VERSION_3 = 0x20080522

X86_64 = {  # system call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
    "mount_setattr": 442, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
    "rt_tgsigqueueinfo": 297, "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144,
    "sched_setaffinity": 203, "sched_setattr": 314, "prlimit64": 302, "ioprio_set": 251, "migrate_pages": 256,
    "move_pages": 279, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "process_madvise": 440, "unshare": 272,
    "setns": 308, "clone": 56, "clone3": 435, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsmount": 432, "fspick": 433,
}
AUDIT_ARCH_X86_64 = 0xC000003E


class Closing(Exception):
    """A layer could not be put in place."""


def call(name: str, result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise Closing(f"{name}: {os.strerror(errno)}")


# --- files ---------------------------------------------------------------------------------

def own_mount_namespace() -> None:
    """A mount namespace of this process's own (as root; otherwise in a user namespace of its
    own, mapping the user to itself), whose changes reach no other."""
    if LIBC.unshare(CLONE_NEWNS) != 0:
        uid, gid = os.getuid(), os.getgid()
        call("unshare", LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNS))
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    call("mount private", LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None))


def set_read_only(path: str, recursive: bool, read_only: bool = True) -> None:
    """mount_setattr(2) (Linux 5.12): every mount under `path` read-only, or one writable."""
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    call("mount_setattr", LIBC.syscall(ctypes.c_long(X86_64["mount_setattr"]), ctypes.c_long(AT_FDCWD),
                                       os.fsencode(path), ctypes.c_ulong(flags), attr, ctypes.c_ulong(len(attr))))


def read_only_but(binds, mounts=()) -> None:
    """Every filesystem read-only in this namespace, but the folders in `binds` (each made a
    mount of its own first) and the mounts at `mounts`; /dev/shm a fresh one of its own. The
    CUDA driver fails to start (error 304) unless it may write its process's /proc files."""
    binds = [os.path.realpath(p) for p in binds]
    for path in binds:
        call(f"bind {path}", LIBC.mount(os.fsencode(path), os.fsencode(path), None, MS_BIND | MS_REC, None))
    set_read_only("/", recursive=True)
    for path in [*binds, *mounts]:
        set_read_only(path, recursive=False, read_only=False)
    if os.path.isdir("/dev/shm"):
        call("tmpfs /dev/shm", LIBC.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777"))


def shared_kernel_cache() -> str:
    """Triton's cache folder, found as Triton finds it."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


def new_kernels(scratch: str) -> str:
    return os.path.join(scratch, "kernels", "new")


def layered_kernel_cache(scratch: str) -> str:
    """Triton's shared cache seen through an overlay: the kernels every runner compiled before
    read from it, this one's written to its scratch; `promote_kernels` adds the new ones to
    the shared cache once the runner is gone, when its caller vouched for the programs it
    ran (fitness.candidate; the others' are compiled anew each time). A cache of its own
    would compile every kernel cold: the recipe's program judged so took 97 s where the
    shared cache took 30 (H200)."""
    shared = shared_kernel_cache()
    os.makedirs(shared, exist_ok=True)
    new, work = new_kernels(scratch), os.path.join(scratch, "kernels", "work")
    os.makedirs(new)
    os.makedirs(work)
    data = f"lowerdir={shared},upperdir={new},workdir={work}"
    call("overlay", LIBC.mount(b"overlay", os.fsencode(shared), b"overlay", 0, data.encode()))
    return shared


PROMOTED_MAX_BYTES = 512 << 20  # a runner's new kernels added at most: no disk filled through the cache
KEY = re.compile(r"[A-Za-z0-9_-]{16,128}")  # a cache key's folder name (Triton 3: 52 base-32 letters)


def promote_kernels(scratch: str) -> None:
    """The kernels a runner compiled, each a folder named by its key, added to the shared
    cache where no folder of that key is (one already there is never replaced: a program
    cannot change what another reads), of plain files only."""
    new, shared = new_kernels(scratch), shared_kernel_cache()
    try:
        keys = os.listdir(new)
    except OSError:
        return
    budget = PROMOTED_MAX_BYTES
    for key in keys:
        source, target = os.path.join(new, key), os.path.join(shared, key)
        try:
            if not KEY.fullmatch(key) or os.path.lexists(target) or not stat.S_ISDIR(os.lstat(source).st_mode):
                continue
            files = [(name, os.lstat(os.path.join(source, name))) for name in os.listdir(source)]
            size = sum(st.st_size for _, st in files)
            if not files or size > budget or not all(stat.S_ISREG(st.st_mode) for _, st in files):
                continue
            staging = tempfile.mkdtemp(prefix=f".{key}-", dir=shared)
            os.chmod(staging, 0o755)
            for name, _ in files:
                shutil.copyfile(os.path.join(source, name), os.path.join(staging, name))
            try:
                os.rename(staging, target)  # whole, or not at all (another runner's came first)
                budget -= size
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
        except OSError:
            continue


# --- other processes -----------------------------------------------------------------------

LD, JEQ, JSET, JGE, JA, RET = 0x20, 0x15, 0x45, 0x35, 0x05, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ...
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38


def arg(i: int) -> int:
    """Offset of argument i's low 32 bits in struct seccomp_data (the kernel reads a pid_t as those)."""
    return 16 + 8 * i


class Program:
    """A seccomp filter assembled with labels: `goto_if` falls through to a far jump."""

    def __init__(self):
        self.code, self.labels = [], {}

    def emit(self, code, k=0, jt=0, jf=0):
        self.code.append([code, jt, jf, k])

    def load(self, offset):
        self.emit(LD, offset)

    def goto_if(self, op, k, label):
        self.emit(op, k, 0, 1)  # true: the next (a jump to label); false: past it
        self.emit(JA, label)

    def goto(self, label):
        self.emit(JA, label)

    def label(self, name):
        self.labels[name] = len(self.code)

    def ret(self, value):
        self.emit(RET, value)

    def assembled(self) -> bytes:
        out = b""
        for i, (code, jt, jf, k) in enumerate(self.code):
            if code == JA:
                k = self.labels[k] - i - 1
            out += struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)
        return out


# Aimed at one process: its pid is the argument given (0 is the caller itself).
ONE_PROCESS = {"kill": 0, "tkill": 0, "tgkill": 0, "rt_sigqueueinfo": 0, "rt_tgsigqueueinfo": 0,
               "sched_setparam": 0, "sched_setscheduler": 0, "sched_setaffinity": 0, "sched_setattr": 0,
               "prlimit64": 0, "migrate_pages": 0, "move_pages": 0, "pidfd_open": 0}
# (which, who): allowed for a process or a process group, when it is the runner's own.
BY_WHICH = {"setpriority": (0, 1), "ioprio_set": (1, 2)}  # PRIO_PROCESS, PRIO_PGRP; IOPRIO_WHO_*
NEVER = ("pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
         "process_madvise", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree",
         "move_mount", "fsopen", "fsmount", "fspick", "mount_setattr")


def filter_program(pid: int) -> bytes:
    """Refuse what reaches another process; a new thread's clone3 answers ENOSYS (glibc
    falls back to clone, whose flags a filter can read) and no clone makes a namespace."""
    p = Program()
    p.load(4)
    p.goto_if(JEQ, AUDIT_ARCH_X86_64, "arch ok")
    p.goto("deny")
    p.label("arch ok")
    p.load(0)
    p.goto_if(JGE, 0x40000000, "deny")  # the x32 ABI's numbers
    for name in (*ONE_PROCESS, *BY_WHICH, *NEVER, "clone", "clone3"):
        p.goto_if(JEQ, X86_64[name], name)
    p.ret(ALLOW)
    for name, index in ONE_PROCESS.items():
        p.label(name)
        p.load(arg(index))
        p.goto_if(JEQ, 0, "allow")
        p.goto_if(JEQ, pid, "allow")
        if name == "kill":
            p.goto_if(JEQ, -pid, "allow")  # its own process group (a runner leads one)
        p.goto("deny")
    for name, (process, group) in BY_WHICH.items():
        p.label(name)
        p.load(arg(0))
        p.goto_if(JEQ, process, f"{name} who")
        p.goto_if(JEQ, group, f"{name} who")
        p.goto("deny")
        p.label(f"{name} who")
        p.load(arg(1))
        p.goto_if(JEQ, 0, "allow")
        p.goto_if(JEQ, pid, "allow")
        p.goto("deny")
    for name in NEVER:
        p.label(name)
        p.goto("deny")
    p.label("clone")
    p.load(arg(0))
    p.goto_if(JSET, NAMESPACES, "deny")
    p.goto("allow")
    p.label("clone3")
    p.ret(ENOSYS)
    p.label("allow")
    p.ret(ALLOW)
    p.label("deny")
    p.ret(EPERM)
    return p.assembled()


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def filter_calls() -> None:
    if platform.machine() != "x86_64":
        raise Closing(f"no filter for {platform.machine()}'s system calls")
    code = filter_program(os.getpid())
    buffer = ctypes.create_string_buffer(code)
    program = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    call("no_new_privs", LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    call("seccomp", LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0))


# --- the way back --------------------------------------------------------------------------

def give_up_capabilities() -> None:
    """Every capability, from the bounding set too (an exec gains none back), and not dumpable."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: then there is none to drop
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    call("capset", LIBC.capset(struct.pack("Ii", CAPABILITY_VERSION_3, 0), bytes(24)))
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def close_off(scratch: str, also_writable=()) -> list:
    """Every layer this process can have; the ones it could not, each with why."""
    os.environ.update(TMPDIR=scratch, CUDA_CACHE_PATH=os.path.join(scratch, "nv"))
    open_layers = []
    try:
        own_mount_namespace()
        try:
            mounts = [layered_kernel_cache(scratch)]
            os.environ["TRITON_CACHE_DIR"] = mounts[0]
        except (Closing, OSError) as err:  # Triton's own, in the scratch: kernels compiled cold
            mounts, own = [], os.path.join(scratch, "kernels", "own")
            os.environ["TRITON_CACHE_DIR"] = own
            open_layers.append(f"the shared kernel cache (each runner compiles into {own}: {err})")
        read_only_but([scratch, f"/proc/{os.getpid()}", *also_writable], mounts)
    except (Closing, OSError) as err:
        open_layers.append(f"files: {err}")
    os.chdir(scratch)  # the folder as this namespace mounts it
    try:
        filter_calls()
    except Closing as err:
        open_layers.append(f"other processes: {err}")
    try:
        give_up_capabilities()
    except Closing as err:
        open_layers.append(f"capabilities: {err}")
    return open_layers


def open_here() -> list:
    """The layers a runner started now would go without (one closed off to see, then gone)."""
    if os.environ.get("RUNNER_ISOLATION") == "off":
        return ["all: RUNNER_ISOLATION=off"]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
        done = subprocess.run([sys.executable, "-m", "fitness.isolation", "--report"], capture_output=True, text=True,
                              env={**os.environ, "RUNNER_SCRATCH": scratch, "PYTHONPATH": repo}, cwd=scratch,
                              timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else [f"all: {done.stderr.strip()[-300:]}"]


def main(argv) -> None:
    if argv == ["--report"]:
        print(json.dumps(close_off(os.environ["RUNNER_SCRATCH"])))
        return
    module, args = argv[0], argv[1:]
    if os.environ.get("RUNNER_ISOLATION") == "off":
        open_layers = ["all: RUNNER_ISOLATION=off"]
    else:
        writable = [p for p in os.environ.get("RUNNER_WRITABLE", "").split(os.pathsep) if p]
        open_layers = close_off(os.environ["RUNNER_SCRATCH"], writable)
    os.environ["RUNNER_OPEN_LAYERS"] = "; ".join(open_layers)  # for the runner's first message
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
