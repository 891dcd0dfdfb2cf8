"""One run of the search: its state, set up fresh or from a checkpoint, the steps the
generation loop calls, the final choice, and a clean stop on Ctrl-C or SIGTERM.

Outputs stay true at every moment: workspace/engine.py is the best correct program
so far (written when it changes), history.csv gains a row per judgement, and the
checkpoint is the state after the last whole generation.
"""
import math
import random
import signal
import time
from pathlib import Path

from deap import tools

from contract.devices import is_cuda
from contract.families import idle_genes, own_genes
from contract.model_config import ModelConfig
from evolve import checkpoint, history, library
from evolve.checkpoint import RunDir, new_run_id
from evolve.config import format_duration
from evolve.final import choose_winner, table_of
from evolve.judging import MAX_GROUP, Evaluator, Judging, WorkerPool, make_workers, screen, unjudged
from evolve.loop import Breeding, Budget, GenerationRecord, evolve
from evolve.memo import Memo
from evolve.population import initial_population, outside_code_line
from evolve.recipe import LineageError, lineage_recipe
from evolve.records import RecordsChanged
from evolve.scores import Scores, target_key
from evolve.toolbox import default_mate_fn, default_mutate_fn, make_hall_of_fame, make_statistics, make_toolbox
from evolve.workspace import Workspace, device_label, roofline_tps, times_the_seed, with_header, write_atomically
from fitness.own_code import CodeChanged
from fitness.weight_files import WeightsChanged


# A screen's share of its batch over the seed's full judgement, before one is measured: on
# a GPU, 5-9 s against 20-30 s. On 2 CPU cores screens took 43-77 s against 92-100 s,
# but reckoned at 2/3 (or 1/3) the default 9-minute run swept 5 (or 11) children and had
# no time for a third generation: a CPU reckons the whole judgement
# (docs/log/2026-11-23-cpu-default-run-sweep-reckoning.md).
SCREEN_SHARE = {"cuda": 1 / 3, "cpu": 1.0}
# A best program this much faster than the seed clears the final's comparison in the rounds
# of a confirmation; a closer one may take up to final_rounds.
CLEAR_GAIN = 1.25
# A final batch's contenders beyond the first add a quarter of a confirmation's gate and rest
# each: their untimed steps run side by side. Its timing is not shared so: every round times
# each contender and the floor, where a confirmation's times one program and its baseline (a
# 20-minute H200 final of three took 130 s, reckoned at 114 s with a quarter more timing each:
# its gate was 1.4x a confirmation's, its timing a round 2x; docs/log/2026-12-01-twenty-minute-run-final-of-three.md).
SHARE_PER_EXTRA_CONTENDER = 1 / 4
# The rounds a close final may run beyond a confirmation's max_rounds, as a share of them. On a
# GPU a quarter: its finals beside a library floor ran 5 and 8 of 12 rounds, their contenders
# clearly slower by then. On a CPU all: beside the seed, a contender 1.01-1.03x it ran 5 and 6
# of 6 (docs/log/2026-12-01-twenty-minute-run-final-of-three.md).
SHARE_PER_EXTRA_ROUND = {"cuda": 1 / 4, "cpu": 1.0}
# A final that times each case staged too (RunConfig.staged_final) runs every timed run twice.
STAGED_TIMING = 2
# A full judgement's timing, where its judge did not say (tests' stand-ins): half of it.
TIMING_SHARE = 1 / 2
# Generations in a row that judged nothing new before the search stops: on a tiny model the
# operators run dry (every child already judged), and a 9-minute CPU run on a tiny Qwen3
# checkpoint spun through 32 empty generations in its last minute.
IDLE_GENERATIONS = 3


class Clock:
    """The wall-clock budget, carried across a resume."""

    def __init__(self, budget_s: float, spent_s: float = 0.0):
        self.budget_s, self.spent_before, self.started = budget_s, spent_s, time.monotonic()

    def spent(self) -> float:
        return self.spent_before + time.monotonic() - self.started

    def left(self) -> float:
        return self.budget_s - self.spent()


class Search:
    def __init__(self, config, run: RunDir, state: dict | None = None, mutate_fn=default_mutate_fn,
                 mate_fn=default_mate_fn, judge_fn=None, spent_before_s: float = 0.0):
        self.config, self.run = config, run
        self.history = history.History(config.history)
        self.scores = Scores.from_history(config.history, run.target)
        self.workspace = Workspace(config.workspace)
        self.hall_of_fame = make_hall_of_fame(config)
        self.stats = make_statistics()
        self.rng = random.Random(config.rng_seed)
        self.pool = WorkerPool(make_workers(config))
        # spent_before_s: what the process spent before it (the imports, the target's checks)
        self.clock = Clock(config.budget_s, (state["spent_s"] if state else 0.0) + spent_before_s)
        memo = Memo()  # every program made, with its lineage: the evaluator reads whose code each is
        # Functions, not values: the time left and the final's reserve (with the hall of fame
        # and the mean judgement) change between one batch and the next.
        self.evaluator = Evaluator(config, run, self.scores, self.history, self.pool.stopping,
                                   self.clock.left, judge_fn, final_reserve=self.final_reserve_s, known=memo.program)
        model = ModelConfig.load(config.model_config)
        self.toolbox = make_toolbox(config, self.hall_of_fame, self.evaluator, self.pool.map, self.rng,
                                    mutate_fn, mate_fn, idle_genes(model), own_genes(model), memo)
        self.judging = Judging(self.toolbox, self.scores, config.workers)
        make = self.toolbox.individual
        self.seed = make(Path(config.seed_engine).read_text(), (), "seed", {})
        self.breeding = Breeding(self.toolbox, self.scores, self.seed, self.rng, config.crossover_prob)
        self.logbook = tools.Logbook()
        self.num_first_declined = 0  # the library's recipes not taken, counted in generation 0's line
        # The best program known before the search (generation 0 judges it first; the seed
        # when none passes): the final holds every contender to it.
        self.floor = self.seed
        self.children_from = None  # while a later generation's children are screened: batches started before
        if state is None:
            self.generation, self.best_id = 0, None
            self.population, not_taken = initial_population(config, make)
            for declined in not_taken:
                self.record_decline(declined, (), stage="library")
            self.num_first_declined = len(not_taken)
            random.seed(self.rng.getrandbits(64))  # DEAP's selections draw from `random`
        else:
            self.restore(state)

    def say(self, line: str) -> None:
        """A line for the console and workspace/results.log alike."""
        print(line, flush=True)
        self.workspace.log(line)

    # -- the steps of the generation loop ------------------------------------------------
    def should_continue(self) -> bool:
        """Generation 0 always runs; later ones while the count and the budget allow, and
        only when the seed passed: a seed judged wrong means the judge or the target is
        broken, and every child would be judged against it in vain."""
        if self.generation == 0:
            return True
        if self.seed.id in self.scores and not self.scores.is_ok(self.seed.id):
            line = f"the seed engine failed its judgement ({self.seed_error()}): stopping the search"
            self.say(line)
            return False
        if self.config.generations is not None and self.generation > self.config.generations:
            return False
        if self.judged_nothing_lately():
            line = f"the last {IDLE_GENERATIONS} generations judged nothing new: stopping the search"
            self.say(line)
            return False
        # One batch of screens and one confirmation must fit, and the final after them: the
        # rest of a generation that does not is skipped batch by batch (judging.Evaluator).
        # Asking for a whole generation would stop a run after the seed, whose first
        # judgement pays for every reference; asking for one judgement's share of a batch
        # left no time for the final (docs/log/2026-11-22-judging-in-batches-8-minute-search.md).
        left, round_s, final_s = self.clock.left(), self.estimated_round_s(), self.estimated_final_s()
        if left > round_s + final_s:
            return True
        # Said, since it can come minutes before the budget's end (a GPU's full judgement ~90 s).
        line = (f"{format_duration(left)} left: a round of screens and a confirmation (~{round_s:.0f} s) and the "
                f"final (~{final_s:.0f} s) would not fit: stopping the search")
        self.say(line)
        return False

    def judged_nothing_lately(self) -> bool:
        recent = [r for r in self.logbook if r["gen"] > 0][-IDLE_GENERATIONS:]
        return len(recent) == IDLE_GENERATIONS and all(r["judged"] == 0 for r in recent)

    def screen(self, generation: int, programs: list, beside: str | None = None) -> list:
        """judging.screen of the programs never judged (those with no judged parent beside
        `beside`), then the hall of fame rebuilt from fresh scores (those judged in full
        enter it at once)."""
        todo = unjudged(programs, self.scores)
        new = screen(self.judging, generation, todo, beside)
        self.update_best(todo)
        return new

    def screen_children(self, generation: int, programs: list) -> list:
        """`screen` of a later generation's children: a batch on each worker, as
        should_continue allowed, then more only while what must follow them for a gain among
        them to be kept still fits (final_reserve_s)."""
        self.children_from = self.evaluator.batches_started
        try:
            return self.screen(generation, programs)
        finally:
            self.children_from = None

    def budget(self) -> Budget:
        """The time left as a breeding generation sees it."""
        return Budget(self.clock.left(), self.estimated_final_s(), self.estimated_screen_s(), self.config.workers)

    def estimated_round_s(self) -> float:
        """A batch of screens (as long as the batches so far, or a full batch of the mean
        screen) and a confirmation."""
        walls = self.evaluator.batch_seconds.get("screen")
        if walls:
            batch = sum(walls) / len(walls)
        else:
            size = min(MAX_GROUP, max(1, self.config.population // self.config.workers))
            batch = size * self.estimated_screen_s()
        return batch + self.scores.mean_judge_seconds(ok_only=True, level="full")

    def estimated_screen_s(self) -> float:
        """A screen's share of its batch: as measured, or before any, SCREEN_SHARE of a full
        judgement."""
        full = self.scores.mean_judge_seconds(level="full", default=self.scores.mean_judge_seconds())
        share = SCREEN_SHARE[self.device_kind()]
        return self.scores.mean_judge_seconds(level="screen", default=share * full)

    def device_kind(self) -> str:
        """"cuda" or "cpu": the key of the per-device shares above."""
        return "cuda" if is_cuda(self.config.device) else "cpu"

    def seed_error(self) -> str:
        rows = history.read(self.config.history)
        rows = rows[(rows["candidate_id"] == self.seed.id) & (rows["status"] != "ok")]
        if not len(rows):
            return "see history.csv"
        status, error = rows["status"].iloc[-1], rows["error"].iloc[-1]
        if status == "incorrect":  # the seed is the reference's math, batched: a deep fp16
            # model rounds past the tolerance in it too
            # (docs/log/2026-11-23-rope-rows-swiglu-gate-at-1b-depth.md: 1.1-1.2x at 22 layers)
            error += (f"; the seed does the reference's math, so the contract's tolerance may not hold "
                      f"on this model: --margin {2 * self.config.margin:g} would let the gate allow more")
        return f"{status}: {error}"

    def final_contenders(self) -> list:
        """The hall of fame's programs the final may compare with the floor, best first:
        those fitted faster than it (one fitted slower is not going to be clearly faster)."""
        floor_speed = self.scores.speed(self.floor.id) if self.scores.is_ok(self.floor.id) else 0.0
        return [p for p in self.hall_of_fame
                if p.id not in (self.seed.id, self.floor.id) and self.scores.speed(p.id) > floor_speed]

    def estimated_final_s(self, contenders: int | None = None) -> float:
        """The final comparison of `contenders` (by default the hall of fame's best
        final_top; the final may add its closing merge to them): full judgements beside the
        floor, with up to final_rounds."""
        ranked = self.final_contenders()
        if contenders is None:
            contenders = min(self.config.final_top, len(ranked))
        # One batch per worker, one at least: with no contender yet, the closing merge. More
        # rounds only for a close call: one well ahead of the floor clears its interval in a
        # confirmation's rounds.
        together = max(1, math.ceil(contenders / self.config.workers))
        best = ranked[0] if ranked else None
        gain = self.scores.gain(best.id, self.floor.id) if best is not None else None
        close = gain is None or gain < CLEAR_GAIN
        extra_rounds = self.config.final_rounds / self.config.max_rounds - 1
        longer = 1 + extra_rounds * SHARE_PER_EXTRA_ROUND[self.device_kind()] if close else 1.0
        wider = 1 + (together - 1) * SHARE_PER_EXTRA_CONTENDER
        runners = (together + 1) / 2  # the contenders and the floor, against a confirmation's two
        staged = STAGED_TIMING if self.config.staged_final else 1.0
        untimed, timing = self.full_judgement_parts()
        return wider * untimed + runners * staged * longer * timing

    def full_judgement_parts(self) -> tuple[float, float]:
        """A confirmation's seconds as a final repeats them, (untimed, timing), from this run's
        full batches: the cheapest gate without its references, plus the most any paid for
        references (the final draws gate traces of its own) and the mean rest; the mean
        timing. A final's contenders are confirmed, so their kernels are compiled for every
        config: a gate that compiles took 31-64 s on an H200, the final's 7-10 s, and a mean
        of whole judgements reckoned finals at 1.5-2.7x their time, leaving minutes of short
        runs unspent (docs/log/2026-11-30-staged-checksum-burst.md). Without phases (tests'
        stand-ins): the mean full judgement, TIMING_SHARE of it timing."""
        batches = self.evaluator.batch_phases.get("full")
        if not batches:
            full = self.scores.mean_judge_seconds(ok_only=True, level="full")
            return full * (1 - TIMING_SHARE), full * TIMING_SHARE
        gate = min(b.gate - b.references for b in batches) + max(b.references for b in batches)
        rest = sum(max(0.0, b.wall - b.gate - b.timing) for b in batches) / len(batches)
        return gate + rest, sum(b.timing for b in batches) / len(batches)

    def final_fits(self, contenders: int) -> bool:
        """Whether a final of `contenders` fits the time left."""
        return self.clock.left() >= self.estimated_final_s(contenders)

    def final_reserve_s(self) -> float:
        """Seconds no other batch may start into: the final's, once there is a contender to
        compare; while a generation's children are screened, also a round after them (the
        merge of their gains, a confirmation) and a final of one. A 20-minute search from the
        seed on 4 layers of Qwen3-30B-A3B spent all but 30 s on its sweep's screens, and so
        confirmed nothing they found (docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md).
        Not for a generation's first batch on each worker: should_continue let the generation
        start for them, and a CPU run that kept its last minutes back from them judged nothing
        in three generations."""
        if self.children_from is not None \
                and self.evaluator.batches_started - self.children_from >= self.config.workers:
            contenders = max(1, min(self.config.final_top, len(self.final_contenders())))
            return self.estimated_round_s() + self.estimated_final_s(contenders)
        return self.estimated_final_s() if self.final_contenders() else 0.0

    def assign_fitness(self, programs) -> None:
        for program in programs:
            program.fitness.values = self.scores.values(program.id, self.config.nsga2)

    def update_best(self, programs) -> None:
        """Rebuild the hall of fame (confirmed programs: derived configs passed too) from fresh
        scores; keep its best in workspace/engine.py."""
        correct = [p for p in list(self.hall_of_fame) + list(programs) if self.scores.is_confirmed(p.id)]
        self.assign_fitness(correct)
        self.hall_of_fame.clear()
        self.hall_of_fame.update(correct)
        if len(self.hall_of_fame) and self.hall_of_fame[0].id != self.best_id:
            best = self.hall_of_fame[0]
            note = f"Best so far after generation {self.generation}: {best.fitness.values[0]:,.0f} tokens/s " \
                   "(geometric mean over the cases, fitted over its judgements and paired comparisons)"
            table = table_of(self.scores.mean_tps(best.id), self.scores.mean_tps(self.seed.id))
            self.put_engine(best, table, self.config.device, note)
            self.best_id = best.id

    def record_decline(self, declined, parent_ids, stage: str = "mutate") -> None:
        self.history.append({**self.run.row_base(self.generation), "parent_ids": parent_ids,
                             "operator": declined.operator, "status": "declined", "stage": stage,
                             "error": declined.reason})

    def finish_generation(self, done: GenerationRecord) -> None:
        """One record for the logbook, the console and results.log; then the checkpoint."""
        passed = sum(1 for fitness, _ in done.new_results if fitness and fitness > 0)
        best = self.hall_of_fame[0] if len(self.hall_of_fame) else None
        record = {"gen": self.generation, "judged": len(done.new_results), "passed": passed,
                  "cached": done.num_cached, "declined": done.num_declined,
                  "pass_rate": passed / len(done.new_results) if done.new_results else float("nan"),
                  **self.stats.compile(self.population),
                  "best_so_far": best.fitness.values[0] if best else 0.0, "best_id": best.id if best else "",
                  "seconds": round(done.seconds, 1), "time_left": round(self.clock.left(), 1)}
        self.logbook.record(**record)
        line = format_record(record)
        self.say(line)
        self.generation += 1
        self.save_checkpoint()

    # -- checkpoint ----------------------------------------------------------------------
    def save_checkpoint(self, finished: bool = False) -> None:
        self.run.save({
            "run_id": self.run.run_id, "target": self.run.target, "config": self.config.to_dict(),
            "generation": self.generation, "spent_s": self.clock.spent(), "finished": finished,
            "population": [p.to_dict() for p in self.population],
            "hall_of_fame": [p.to_dict() for p in self.hall_of_fame],
            "logbook": [dict(r) for r in self.logbook], "best_id": self.best_id, "floor": self.floor.to_dict(),
            "rng_state": self.rng.getstate(), "random_state": random.getstate(),
            "operator_selector": self.toolbox.selector.to_dict(),
            "made_here": sorted(i for i, made in self.evaluator.made_here.items() if made)})

    def bank_spent_time(self) -> None:
        """The last checkpoint (the start of this generation), with the time spent until now,
        so a resumed run gets only the budget that is left."""
        state = checkpoint.load(self.run.path)
        state["spent_s"] = self.clock.spent()
        self.run.save(state)

    def restore(self, state: dict) -> None:
        make = self.toolbox.individual
        self.population = [make(**p) for p in state["population"]]
        self.generation, self.best_id = state["generation"], state["best_id"]
        if state.get("floor", {}).get("source", self.seed.source) != self.seed.source:  # older checkpoints have none
            self.floor = make(**state["floor"])
        self.rng.setstate(state["rng_state"])
        self.toolbox.selector.load(state.get("operator_selector"))  # what the bandit learnt
        # Whose code is the repository's: the memo holds no lineage from before the resume.
        self.evaluator.made_here.update(dict.fromkeys(state.get("made_here", ()), True))
        random.setstate(state["random_state"])
        for record in state["logbook"]:
            self.logbook.record(**record)
        self.update_best([make(**p) for p in state["hall_of_fame"]])
        self.assign_fitness(self.population)  # tournaments compare fitness from the first breeding on

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> None:
        """Choose the winner by fresh interleaved measurements; leave it and its story."""
        winner, ratio, table, how = choose_winner(self.judging, self.seed, self.floor, self.final_contenders(),
                                                  self.config.final_top, self.generation, self.final_fits,
                                                  self.config.staged_final)
        is_ok = self.scores.is_ok(winner.id)
        note = f"Winner: {times_the_seed(ratio)} (geometric mean tokens/s; {how})" if is_ok \
            else "No program was judged correct: this is the seed, unverified"
        steps = self.put_engine(winner, table, device_label(self.config.device), note)
        self.best_id = winner.id
        write_atomically(self.run.path / "winner.py", winner.source)
        if is_ok:
            self.workspace.log_final(winner.id, table, steps, ratio, how, roofline_tps(self.config))
            line = f"winner {winner.id}: {times_the_seed(ratio)}, {how}"
            if winner.id != self.seed.id:
                kept = self.keep_in_library(winner, table, ratio)
                self.say(kept)
        else:
            line = "no program was judged correct: workspace/engine.py is the seed, unverified"
            self.workspace.log(line)
        self.save_checkpoint(finished=True)
        print(f"{line}; workspace {self.workspace.root}, run {self.run.path}", flush=True)

    def keep_in_library(self, winner, table: list, ratio: float) -> str:
        """Add the winner's recipe, with what it was judged on, to the run's library, so the
        next run starts from it; the line that says what became of it."""
        try:
            text = lineage_recipe(history.read(self.config.history), winner.id, self.config.history)
        except LineageError as err:
            return f"library: the winner is not added, its lineage is no recipe: {err}"
        judged = library.judged_as(library.RunTarget.of(self.config), device_label(self.config.device), table, ratio,
                                   self.run.run_id, winner.id)
        path = library.add_winner(self.config.library_dir, text, judged)
        return f"library: the winner's recipe is {path}" if path else "library: the winner's recipe was there already"

    def put_engine(self, program, table: list, device: str, note: str) -> list:
        """workspace/engine.py: `program` under a header naming this run, its lineage (which
        is returned), its figures against the seed and the device."""
        steps = history.lineage(history.read(self.config.history), program.id)
        self.workspace.put_engine(with_header(program.source, self.run.run_id, steps, table, device, note))
        return steps

    def stop(self, why: str, resumable: bool = True) -> None:
        """After an interrupt: end the judgements in flight and say how to go on."""
        self.pool.stop()
        if resumable:
            self.bank_spent_time()
        if not self.workspace.engine.exists():  # nothing judged correct yet: the seed stands in
            self.workspace.put_engine(self.seed.source)
        line = f"stopped by {why} during generation {self.generation}"
        self.say(line + (f"; resume with: python -m evolve run --resume {self.run.path}" if resumable else ""))


def format_record(r: dict) -> str:
    """The console's line for a generation. Its speeds are fitted over every judgement and
    paired comparison so far, so they move as evidence comes in; report.txt's per-generation
    table gives each generation's raw judged figures instead."""
    rate = "-" if math.isnan(r["pass_rate"]) else f"{r['pass_rate']:.0%}"
    return (f"gen {r['gen']:>3} | judged {r['judged']:>2} passed {r['passed']:>2} ({rate:>4}) "
            f"cached {r['cached']} declined {r['declined']} | fitted best {r['best_so_far']:,.0f} tok/s "
            f"[{r['best_id'] or '-'}] median {r['median']:,.0f} | {format_duration(r['time_left'])} left")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, raised in the main thread wherever it was."""


def raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def run(config, state: dict | None = None, run_id: str = "", spent_before_s: float = 0.0, **fns) -> int:
    """A whole run (or the rest of one), `spent_before_s` of its budget gone; the exit status."""
    run_dir = RunDir(config.runs_dir, run_id or new_run_id(), target_key(config))
    search = Search(config, run_dir, state, spent_before_s=spent_before_s, **fns)
    search.workspace.log_start(run_dir.run_id, config.to_dict(), state and state["generation"])
    print(f"run {run_dir.run_id}: {config.device}, {config.workers} worker(s), "
          f"{format_duration(search.clock.left())} budget left, run dir {run_dir.path}", flush=True)
    outside = outside_code_line(search.population) if state is None and is_cuda(config.device) else None
    if outside:  # a GPU's Triton kernels (a CPU compiles none)
        search.say(outside)
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        if state is None:
            search.save_checkpoint()  # resumable from the first moment
        evolve(search)
        search.finish()
        return 0
    except KeyboardInterrupt as err:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        why = str(err) if isinstance(err, Interrupted) else "SIGINT"
        search.stop(why)
        return 143 if why == "SIGTERM" else 130
    except WeightsChanged as err:  # a candidate wrote the files the references come from
        line = f"{err}: the references come from these files; restore them before resuming"
        search.say(line)
        search.stop("changed weights")
        return 3
    except CodeChanged as err:  # a candidate wrote the code a judge or a runner imports
        search.say(f"{err}: a candidate rewrote them; restore them (git checkout, pip install) before resuming")
        search.stop("changed code")
        return 3
    except RecordsChanged as err:  # a candidate wrote history.csv or the checkpoint
        search.say(f"{err}: a candidate wrote it; this run's records are not to be trusted, nor resumed from")
        search.stop("changed records", resumable=False)
        return 3
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        search.pool.close()  # the judges and their runners
        search.pool.executor.shutdown(wait=False, cancel_futures=True)
        # The judges' stop counted: a 20-minute H200 run.sh ended 21 s past its budget.
        print(f"{format_duration(search.clock.spent())} of the {format_duration(config.budget_s)} budget spent",
              flush=True)

