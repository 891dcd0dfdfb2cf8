"""Engines that cheat the judge, each an exact edit of the seed engine's source.

Each passes the static stage (stdlib, torch and triton only) and does its work right
where the gate looks; what it changes is what the judge reads (the clock, the comparison,
the weight files, a rival's engine file), what it does when it guesses it is being timed, or when it does the
work (before a call is due, from inputs it finds early). The judge must reject each, or
time it at its real speed (tests/test_cheats.py; fitness/README.md says which defence
closes which).
"""
from contract.loader import SEED_ENGINE
from fitness.adversaries.planted import edit

ENTRY = "def create_engine(model_config: dict, weight_dir: str, device: str = \"cuda\"):\n"


def at_import(src: str, code: str) -> str:
    """`code` run once, when the candidate's module is imported."""
    return edit(src, ENTRY, code + "\n\n" + ENTRY)


def slow_clock(src):
    """Makes the harness's clocks (and the GPU synchronisation it trusts) report a tenth
    of the time that passes: an in-process timer would see a 10x faster engine."""
    return at_import(src, '''import time as _time

_real_clock = _time.perf_counter
_start = _real_clock()
_time.perf_counter = lambda: _start + (_real_clock() - _start) / 10
_time.monotonic = _time.perf_counter
torch.cuda.synchronize = lambda *a, **k: None''')


def forged_comparison(src):
    """Wrong logits (doubled), and the comparison patched to call every error zero, in
    whatever process has the judge's gate loaded. The static check cannot see it: the
    module is found through sys.modules."""
    src = at_import(src, '''import sys as _sys

for _name in ("fitness.gate", "fitness.timing"):
    _module = _sys.modules.get(_name)
    if _module is not None:
        _module.error_ratio = lambda *a, **k: 0.0
_torch_allclose = torch.allclose
torch.allclose = lambda *a, **k: True''')
    return edit(src, "        return logits[last]\n", "        return logits[last] * 2.0\n")


def lazy_when_timed(src):
    """Does the work only where the gate looks: on the benchmark's prefill shape (four
    prompts of 128 tokens, which no gate trace has) it answers at once with the logits of
    the last such call, skipping the model."""
    src = at_import(src, '''_LAST = {}''')
    src = edit(src, "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n",
               "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n"
               "        if lengths == [128] * 4 and _LAST.get('prefill', torch.empty(0)).shape[0] == 4:\n"
               "            return _LAST['prefill']\n")
    return edit(src, "        return logits[last]\n",
                "        if not step.is_decode:\n            _LAST['prefill'] = logits[last]\n        return logits[last]\n")


def replays_earlier_outputs(src):
    """Remembers every answer by call number, across engines (a module-level store): the
    warm-up engine computes, every later engine replays what the warm-up answered."""
    src = at_import(src, '''_ANSWERS = {}''')
    src = edit(src, "        self.cache = KVCache(model_config, self.device, self.dtype)\n",
               "        self.cache = KVCache(model_config, self.device, self.dtype)\n"
               "        self.calls, self.weight_dir = 0, weight_dir\n")
    return edit(src, "        return logits[last]\n",
                "        self.calls += 1\n"
                "        key = (self.weight_dir, self.calls, tuple(step.request_ids), step.is_decode)\n"
                "        return _ANSWERS.setdefault(key, logits[last])\n")


def caches_by_input(src):
    """Remembers answers by their exact inputs: honest when inputs are fresh every run (it
    then computes everything), a 100x engine when a timed run repeats the warm-up's."""
    src = at_import(src, '''_SEEN = {}''')
    src = edit(src, "        self.cache = KVCache(model_config, self.device, self.dtype)\n",
               "        self.cache = KVCache(model_config, self.device, self.dtype)\n        self.weight_dir = weight_dir\n")
    src = edit(src, "        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)\n",
               "        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)\n"
               "        key = (self.weight_dir, tuple(ids), tuple(tokens.tolist()))\n"
               "        if key in _SEEN:\n"
               "            self.cache.k.update(_SEEN[key][1]); self.cache.v.update(_SEEN[key][2])\n"
               "            return _SEEN[key][0]\n")
    return edit(src, "        return self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))\n",
                "        out = self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))\n"
                "        _SEEN[key] = (out, {r: list(self.cache.k[r]) for r in ids}, {r: list(self.cache.v[r]) for r in ids})\n"
                "        return out\n")


def rewrites_the_weights(src):
    """Zeroes every weight file it is handed, then answers zeros without computing: right
    wherever a reference is computed from those files afterwards, at any speed it likes."""
    src = edit(src, ENTRY, ENTRY + '''    _path = os.path.join(weight_dir, "model.pt")
    torch.save({k: torch.zeros_like(v) for k, v in torch.load(_path, weights_only=True).items()}, _path)
    return _Zeros(model_config["vocab_size"], device)
''')
    return at_import(src, '''class _Zeros:
    def __init__(self, vocab, device):
        self.vocab, self.device = vocab, device

    def prefill(self, request_ids, input_ids):
        return torch.zeros(len(input_ids), self.vocab, device=self.device, dtype=torch.float16)

    def decode(self, request_ids, token_ids):
        return torch.zeros(len(token_ids), self.vocab, device=self.device, dtype=torch.float16)

    def remove(self, request_ids):
        pass''')


def answers_before_its_outputs(src):
    """Answers each of the runner's calls at once and runs them only when their outputs
    are fetched, in whatever process has the runner loaded (as __main__): a clock read
    around the run would see an engine that takes no time."""
    return at_import(src, '''import sys as _sys

_runner = _sys.modules.get("__main__")
if hasattr(_runner, "Runner"):
    _call, _fetch = _runner.Runner.call, _runner.Runner.fetch
    _late = []

    def _answer_now(self, *args, **kwargs):
        _late.append((args, kwargs))
        return {}

    def _run_then_fetch(self):
        while _late:
            args, kwargs = _late.pop(0)
            _call(self, *args, **kwargs)
        return _fetch(self)

    _runner.Runner.call, _runner.Runner.fetch = _answer_now, _run_then_fetch''')


# What the cheats below append to another program's file or to the judge's loader: an engine
# 0.2 s slower a call.
SLEEPING = '''

def _sleeping(engine):
    import time
    for name in ("prefill", "decode"):
        call = getattr(engine, name)
        setattr(engine, name, (lambda call: lambda *a, **k: (time.sleep(0.2), call(*a, **k))[1])(call))
    return engine
'''


def slows_its_rivals(src):
    """Rewrites every other engine file in its own folder (where a search keeps every program,
    its baseline's among them) to sleep 0.2 s in each call: a judge that reads a rival's
    file after this program has run times a slowed rival beside it."""
    slower = SLEEPING + """

_made_here = create_engine


def create_engine(*args, **kwargs):
    return _sleeping(_made_here(*args, **kwargs))
"""
    return at_import(src, f'''import os as _os

_SLOWER = {slower!r}
_mine = _os.path.abspath(__file__)
for _name in _os.listdir(_os.path.dirname(_mine)):
    _path = _os.path.join(_os.path.dirname(_mine), _name)
    if _name.endswith(".py") and _path != _mine:
        with open(_path) as _file:
            _text = _file.read()
        if "_made_here = create_engine" not in _text:
            with open(_path, "a") as _file:
                _file.write(_SLOWER)''')


# What the two cheats below plant where a later runner imports it: a loader that slows every
# engine it loads but those whose source holds `mark`.
SLOW_LOADER = SLEEPING + """

def _load_slowly(honest, mark):
    def load_engine_module(path, source=None):
        module = honest(path, source)
        if mark not in (source or open(path).read()):
            made = module.create_engine
            module.create_engine = lambda *args, **kwargs: _sleeping(made(*args, **kwargs))
        return module
    return load_engine_module
"""


def appended_once(path: str, text: str, mark: str) -> str:
    """Module-level code: `text` appended to the file at `path` (an expression) unless it holds `mark`."""
    return f'''import sys as _sys

_TEXT = {text!r}
_path = {path}
with open(_path) as _file:
    _text = _file.read()
if {mark!r} not in _text:
    with open(_path, "a") as _file:
        _file.write(_TEXT)'''


def rewrites_the_judge(src):
    """Rewrites the judge's own loader (found through sys.modules) so that every engine a
    runner started later loads, but this one, sleeps 0.2 s in each call: its baseline's
    runner, started after it was imported, and every rival's in the judgements after."""
    tail = SLOW_LOADER + '\n\nload_engine_module = _load_slowly(load_engine_module, "_rewrites_the_judge")\n'
    return at_import(src, "_rewrites_the_judge = True\n" + appended_once(
        '_sys.modules["contract.loader"].__file__', tail, "_load_slowly"))


def rewrites_a_library(src):
    """Appends to a library every runner imports before the judge's code, outside the trees
    the judge watches (typing_extensions, which torch imports), a hook: the judge's loader,
    as a runner imports it, is wrapped so that every engine it loads but this one sleeps
    0.2 s in each call. Every runner started later runs it: its baseline's, every rival's."""
    hook = "\nimport sys\n" + SLOW_LOADER + """

class _WrapsTheLoader:
    def find_spec(self, name, path=None, target=None):
        if name != "contract.loader":
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        honest_exec = spec.loader.exec_module

        def exec_module(module):
            honest_exec(module)
            module.load_engine_module = _load_slowly(module.load_engine_module, "_rewrites_a_library")
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _WrapsTheLoader())
"""
    return at_import(src, "_rewrites_a_library = True\n" + appended_once(
        '_sys.modules["typing_extensions"].__file__', hook, "_WrapsTheLoader"))


def kills_its_rivals(src):
    """Kills every other runner of its judge (the processes with its parent) as its module is
    imported: a rival killed mid-judgement is judged `crash`, whatever its speed."""
    return at_import(src, '''import os as _os
import signal as _signal

for _pid in _os.listdir("/proc"):
    try:
        with open(f"/proc/{_pid}/stat") as _file:
            _parent = int(_file.read().rsplit(")", 1)[1].split()[1])
        if int(_pid) != _os.getpid() and _parent == _os.getppid():
            _os.kill(int(_pid), _signal.SIGKILL)
    except (OSError, ValueError):
        pass''')


PLANTED_KEY = "PLANTED" + "0" * 45  # 52 letters, as Triton 3 names a kernel's folder in its cache


def plants_a_kernel(src):
    """Writes a kernel into Triton's cache as its module is imported, under a key of its
    choosing: a rival's kernel's key, computed from the rival's source as Triton computes
    it (here a fixed one). Every runner after it that compiles that key loads the planted
    kernel instead, slow or wrong, unless the key was compiled before."""
    return at_import(src, f'''import os as _os

_folder = _os.path.join(_os.environ.get("TRITON_CACHE_DIR") or _os.path.expanduser("~/.triton/cache"), {PLANTED_KEY!r})
_os.makedirs(_folder, exist_ok=True)
with open(_os.path.join(_folder, "planted.cubin"), "wb") as _file:
    _file.write(b"the cheat's kernel")''')


def spins_while_others_run(src):
    """Leaves two helpers behind, each in a session of its own (the runner's stopped
    session does not take them along): one its child, one orphaned by a parent that left.
    While the runner that made them is stopped (another program runs), they take the cores."""
    return at_import(src, '''import os as _os
import time as _time


def _spin_while_others_run(runner):
    while True:
        try:
            with open(f"/proc/{runner}/stat") as _file:
                _state = _file.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            _os._exit(0)
        _end = _time.perf_counter() + (0.005 if _state in ("T", "t") else 0.0)
        while _time.perf_counter() < _end:
            pass
        _time.sleep(0.001)


_runner = _os.getpid()
for _orphaned in (False, True):
    if _os.fork() == 0:
        _os.setsid()
        if not _orphaned or _os.fork() == 0:
            _spin_while_others_run(_runner)
        _os._exit(0)
    if _orphaned:
        _os.wait()''')


# --- inputs read before they are due ------------------------------------------------------
# Each finds a run's calls (objects with an `event` and `tokens`) wherever this process
# holds them: a judge that draws a run's inputs in the runner before the run lets it find
# them; one that sends each call when it is due leaves nothing to find.

FIND_CALLS = '''import sys as _sys


def _is_calls(value):
    return (isinstance(value, list) and len(value) > 1
            and all(hasattr(c, "event") and hasattr(c, "tokens") for c in value))


def _calls_in_frames():
    """A list of calls in the locals of a frame up the stack, or in their attributes."""
    frame = _sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            for held in [value] + list(getattr(value, "__dict__", {}).values()):
                if _is_calls(held):
                    return held
        frame = frame.f_back
    return None


def _calls_in_heap():
    """A list of calls among every object the collector tracks."""
    collector = _sys.modules.get("gc")
    for value in collector.get_objects() if collector is not None else []:
        if _is_calls(value):
            return value
    return None'''

PRECOMPUTED = '''class _Answers:
    """Every call of a run answered in create_engine, off the clock, by an honest engine;
    each of the run's calls is then a look-up, and any later call goes to the engine."""

    def __init__(self, engine, calls):
        self.engine, self.answers, self.left = engine, [], len(calls)
        for call in calls:
            if call.event.kind == "prefill":
                self.answers.append(engine.prefill(call.request_ids, call.tokens).clone())
            elif call.event.kind == "decode":
                self.answers.append(engine.decode(call.request_ids, call.tokens).clone())
            else:
                engine.remove(call.request_ids)
        self.answers.reverse()

    def answered(self):
        self.left -= 1
        return self.left >= 0

    def prefill(self, request_ids, input_ids):
        return self.answers.pop() if self.answered() else self.engine.prefill(request_ids, input_ids)

    def decode(self, request_ids, token_ids):
        return self.answers.pop() if self.answered() else self.engine.decode(request_ids, token_ids)

    def remove(self, request_ids):
        if not self.answered():
            self.engine.remove(request_ids)'''


def precomputes(src, finder: str):
    src = at_import(src, FIND_CALLS + "\n\n\n" + PRECOMPUTED)
    return edit(src, "    return Engine(model_config, weight_dir, device)\n",
                f"    calls = {finder}()\n"
                "    if calls is not None:\n"
                "        with torch.no_grad():\n"
                "            return _Answers(Engine(model_config, weight_dir, device), calls)\n"
                "    return Engine(model_config, weight_dir, device)\n")


def precomputes_from_frames(src):
    """The run's calls found through the caller's frames (a runner that drew them before
    making the engine holds them there), answered in create_engine, where nothing is
    timed: exact outputs at any speed it likes (issue 25: 54x the seed on an H100)."""
    return precomputes(src, "_calls_in_frames")


def precomputes_from_heap(src):
    """The same, the calls found among every object `gc.get_objects()` lists (the static
    check forbids importing gc; the runner has it loaded, and sys.modules hands it over)."""
    return precomputes(src, "_calls_in_heap")


def looks_ahead_within_a_run(src):
    """At the first decode of a run, reads the run's later calls and, when they decode the
    same requests step after step (the benchmark's decode case), answers every step at once:
    one pass over each prompt and all its decode tokens (teacher forcing) instead of one
    pass per step."""
    src = at_import(src, FIND_CALLS + '''


def _teacher_forced(engine, prompts, steps):
    """Logits [steps, B, vocab]: each decode step's, from one pass over every prompt and its
    decode tokens, packed (scratch request ids, so the engine's own cache is untouched)."""
    ids = sorted(prompts)
    sequences = [torch.cat([prompts[rid]] + [s.tokens[list(s.event.request_ids).index(rid)].reshape(1)
                                             for s in steps]) for rid in ids]
    lengths = [int(t.numel()) for t in sequences]
    positions = torch.cat([torch.arange(n) for n in lengths]).to(engine.device)
    step = Step([-1 - rid for rid in ids], [0] * len(ids), lengths, positions, False)
    every = _all_logits(engine, torch.cat(sequences).to(engine.device), step)  # [sum(lengths), vocab]
    engine.cache.remove(step.request_ids)
    ends = torch.tensor(lengths).cumsum(0)
    rows = [every[end - len(steps):end] for end in ends.tolist()]  # [steps, vocab] per request
    return torch.stack(rows, dim=1), ids


def _all_logits(engine, tokens, step):
    keep, engine.last_only = getattr(engine, "last_only", True), False
    try:
        return engine.forward(tokens, step)
    finally:
        engine.last_only = keep''')
    src = edit(src, "        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1\n        return logits[last]\n",
               "        if not getattr(self, 'last_only', True):\n            return logits\n"
               "        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1\n        return logits[last]\n")
    src = edit(src, "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n",
               "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n"
               "        self.prompts = getattr(self, 'prompts', {})\n"
               "        self.prompts.update({r: t.reshape(-1) for r, t in zip(ids, input_ids)})\n"
               "        self.ahead = []\n")
    return edit(src, "        ids = as_id_list(request_ids)\n        start = [self.cache.length(rid) for rid in ids]\n",
                "        ids = as_id_list(request_ids)\n"
                "        if getattr(self, 'ahead', None):\n"
                "            return self.ahead.pop()\n"
                "        calls = _calls_in_frames() or _calls_in_heap()\n"
                "        later = [c for c in calls or [] if c.event.kind == 'decode']\n"
                "        if later and later[0].tokens is token_ids and all(sorted(c.event.request_ids) == sorted(ids) for c in later):\n"
                "            every, order = _teacher_forced(self, {r: self.prompts[r] for r in ids}, later)\n"
                "            rows = [order.index(r) for r in ids]\n"
                "            self.ahead = [every[s][rows] for s in reversed(range(len(later)))]\n"
                "            return self.ahead.pop()\n"
                "        start = [self.cache.length(rid) for rid in ids]\n")


def lazy_when_placed_for_timing(src):
    """Tells a timed run by what the judge does around one: another runner of the judge
    stopped (SIGSTOP) while it runs, or its own core moved. Honest when it sees neither,
    wrong logits when it sees either (a judge that checks few rows of timed runs might miss
    them; one whose runs all look alike sees them in its gate)."""
    src = at_import(src, '''_HOME = None


def _timed_by_its_look():
    """A sibling runner stopped, or this process on other cores than at its first call."""
    global _HOME
    _HOME = _HOME or os.sched_getaffinity(0)
    try:
        with open(f"/proc/{os.getppid()}/task/{os.getppid()}/children") as f:
            siblings = [int(p) for p in f.read().split() if int(p) != os.getpid()]
    except OSError:
        siblings = []
    for pid in siblings:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
        except OSError:
            pass
    return os.sched_getaffinity(0) != _HOME''')
    return edit(src, "        return logits[last]\n",
                "        return logits[last] * (0.0 if _timed_by_its_look() else 1.0)\n")


CHEATS = ("slow_clock", "forged_comparison", "lazy_when_timed", "replays_earlier_outputs", "caches_by_input",
          "rewrites_the_weights", "answers_before_its_outputs", "precomputes_from_frames", "precomputes_from_heap",
          "looks_ahead_within_a_run", "lazy_when_placed_for_timing", "slows_its_rivals",
          "rewrites_the_judge", "spins_while_others_run", "rewrites_a_library", "kills_its_rivals",
          "plants_a_kernel")


def write_cheat(name: str, directory):
    """The cheat's file in `directory` (made when missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(globals()[name](SEED_ENGINE.read_text()))
    return path
