"""The search's logic with a fake judge and stand-in operators: fast, no child processes."""
import pickle
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import evolve.config
import evolve.judging
from evolve import checkpoint, final, history
from evolve.checkpoint import RunDir
from evolve.config import RunConfig, SettingsError, parse_duration
from evolve.judging import FINAL, BatchPhases, Judging, ProgramBatch, make_workers, progress_line
from evolve.population import initial_population, outside_code_line, seed_sources
from evolve.scores import Scores, target_key
from evolve.search import Search, run
from evolve.program import Program, made_here
from evolve.records import RecordsChanged
from fitness import own_code
from fitness.weight_files import fingerprint
from contract.loader import source_hash
from mutations.base import Declined
from tests.conftest import SEED_ENGINE
from tests.test_evolve_stand_in import crossover, fake_judge, random_mutation, stand_in_speed

STAND_INS = {"mutate_fn": random_mutation, "mate_fn": crossover, "judge_fn": fake_judge}


def make_config(small_target, tmp_path, **changes):
    config_path, weight_dir = small_target
    settings = dict(model_config=config_path, weight_dir=weight_dir, population=4, generations=2, workers=1,
                    runs_dir=tmp_path / "runs", workspace=tmp_path / "ws", history=tmp_path / "history.csv",
                    rng_seed=7, final_top=2)
    return RunConfig.build("cpu", **{**settings, **changes})


def only_run_dir(config):
    (path,) = [p for p in config.runs_dir.iterdir() if p.name != "gate_weights"]
    return path


def test_two_generations_write_history_workspace_and_checkpoint(small_target, tmp_path):
    config = make_config(small_target, tmp_path)
    assert run(config, **STAND_INS) == 0
    frame = pd.read_csv(config.history)  # plain pandas reads it
    assert tuple(frame.columns) == history.COLUMNS
    assert set(frame["generation"]) >= {0, 1, 2}
    judged = history.judged_rows(history.read(config.history))
    assert not judged["candidate_id"].duplicated().any(), "a source was judged twice"
    confirmed = frame[frame["operator"] == "confirm"]
    assert len(confirmed) >= 1 and (confirmed["level"] == "full").all()
    final = frame[frame["operator"] == "final"]
    seed_id = frame.loc[frame["operator"] == "seed", "candidate_id"].iloc[0]  # after the library's declines
    assert 1 <= len(final) <= 2 and (final["baseline_id"] == seed_id).all()
    assert frame.loc[frame["status"] == "incorrect", "fitness"].eq(0).all()
    run_dir = only_run_dir(config)
    for path in frame.loc[frame["candidate_id"].notna(), "source_path"]:
        assert path.startswith(str(run_dir / "candidates"))
    state = checkpoint.load(run_dir)
    assert state["generation"] == 3 and state["finished"]
    winner = (run_dir / "winner.py").read_text()
    engine = (config.workspace / "engine.py").read_text()
    assert engine.split('"""', 2)[2] == winner.split('"""', 2)[2]  # the winner's code, under a header of its own
    log = (config.workspace / "results.log").read_text()
    assert "settings:" in log and "gen   2" in log and "lineage: seed" in log


def test_a_search_whose_operators_run_dry_stops_after_three_idle_generations(small_target, tmp_path, capsys):
    def dry(*args):
        return Declined("dry", "nothing left to change")

    config = make_config(small_target, tmp_path, generations=20)
    assert run(config, **{**STAND_INS, "mutate_fn": dry, "mate_fn": dry}) == 0
    state = checkpoint.load(only_run_dir(config))
    assert state["finished"] and state["generation"] == 4  # 0 judged the seed; 1-3 judged nothing
    assert "the last 3 generations judged nothing new: stopping the search" in capsys.readouterr().out


def test_workspace_holds_the_best_correct_program(small_target, tmp_path):
    config = make_config(small_target, tmp_path, final_top=1)
    run(config, **STAND_INS)
    frame = history.read(config.history)
    ok = frame[(frame["status"] == "ok")]
    engine = (config.workspace / "engine.py").read_text()
    assert "stand_in_break" not in engine
    assert history.tps_column("prefill") in frame.columns and ok["fitness"].gt(0).all()


def test_changed_weights_stop_the_run_with_its_rows_recorded(small_target, tmp_path, capsys):
    config = make_config(small_target, tmp_path, generations=3)
    calls = []

    def judge_until_the_weights_change(path, *args, **kwargs):
        calls.append(path)
        verdict = fake_judge(path, *args, **kwargs)
        assert kwargs["weights_fingerprint"] == fingerprint(config.weight_dir)  # as the run found them
        if len(calls) == 3:  # as fitness.judge says it when a trusted file changed
            verdict.update(status="invalid", stage="weights", error="model.pt changed on disk", weights_changed=True)
        return verdict

    assert run(config, **{**STAND_INS, "judge_fn": judge_until_the_weights_change}) == 3
    assert len(calls) == 5  # the seed, then the batch of four in which it was said; nothing after
    out = capsys.readouterr().out
    assert "model.pt changed on disk (judging " in out and "restore them before resuming" in out
    assert "stopped by changed weights during generation 1" in out
    rows = history.read(config.history)
    assert (rows["stage"] == "weights").sum() == 1 and not checkpoint.load(only_run_dir(config))["finished"]


def test_programs_rewritten_between_judgements_are_restored_and_held_to_their_hashes(small_target, tmp_path):
    """A candidate can rewrite any program's file (fitness.adversaries.cheats.slows_its_rivals):
    before each judgement the search writes every file it hands over as its program, the
    baseline's too, and tells the judge each one's hash."""
    config = make_config(small_target, tmp_path)
    handed = []

    def judge_then_scribble(path, *args, baseline=None, source_hashes=None, **kwargs):
        for file in [path] + ([baseline] if baseline else []):  # as written, and said so
            assert source_hash(Path(file).read_text()) == source_hashes[str(Path(file).resolve())]
        handed.append(baseline)
        verdict = fake_judge(path, *args, baseline=baseline, **kwargs)
        # As a candidate could: every other program's file (the judge reads those of its own
        # judgement before any runs: tests/test_cheats.py).
        for other in Path(path).parent.glob("*.py"):
            if str(other.resolve()) not in source_hashes:
                other.write_text(other.read_text() + "stand_in_scribble = 1\n")
        return verdict

    assert run(config, **{**STAND_INS, "judge_fn": judge_then_scribble}) == 0
    assert sum(b is not None for b in handed) >= 4  # screens, confirmations and the final, beside baselines
    winner = (only_run_dir(config) / "winner.py").read_text()
    assert "stand_in_scribble" not in winner and "stand_in_scribble" not in (config.workspace / "engine.py").read_text()


def test_changed_code_stops_the_run_though_no_judge_said_so(small_target, tmp_path, capsys, monkeypatch):
    """A candidate that rewrites the judge's code and kills its judge leaves no verdict that
    says so; the search, holding the code to what it was before any candidate ran, stops."""
    watched = tmp_path / "judge_code"
    watched.mkdir()
    (watched / "gate.py").write_text("honest = True\n")
    monkeypatch.setattr(own_code, "roots", lambda: [watched])
    config = make_config(small_target, tmp_path, generations=3)
    calls = []

    def judge_then_rewrite_the_code(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            (watched / "gate.py").write_text("honest = False\n")
        return fake_judge(path, *args, **kwargs)

    assert run(config, **{**STAND_INS, "judge_fn": judge_then_rewrite_the_code}) == 3
    assert len(calls) == 5  # the seed, then the batch of four in which it happened; nothing after
    out = capsys.readouterr().out
    assert f"the code that judges changed on disk while candidates ran: {watched / 'gate.py'} (judging " in out
    assert "stopped by changed code during generation 1" in out


def test_a_row_someone_else_wrote_stops_the_run_which_cannot_be_resumed(small_target, tmp_path, capsys):
    """A candidate could append a row saying a program it wrote was judged fast and correct,
    which a later run's --seed-from would take as confirmed."""
    config = make_config(small_target, tmp_path, generations=3)
    calls = []

    def judge_then_forge_a_row(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            with open(config.history, "a") as f:
                f.write("forged,0,ffffffffffffffff,,,ok\n")
        return fake_judge(path, *args, **kwargs)

    assert run(config, **{**STAND_INS, "judge_fn": judge_then_forge_a_row}) == 3
    assert len(calls) == 5  # the batch in which it happened, and nothing after
    out = capsys.readouterr().out
    assert f"{config.history} changed on disk since this run last wrote it" in out
    assert "stopped by changed records during generation 1\n" in out and "resume with" not in out.split("changed records")[1]


def test_a_checkpoint_is_read_back_as_plain_data_only(tmp_path):
    run_dir = RunDir(tmp_path, "run", "target")
    run_dir.save({"generation": 2, "spent_s": 1.5})
    assert checkpoint.load(run_dir.path)["generation"] == 2
    (run_dir.path / checkpoint.CHECKPOINT).write_bytes(pickle.dumps({"format": checkpoint.FORMAT, "x": Path("/")}))
    with pytest.raises(pickle.UnpicklingError, match="plain data, not pathlib"):
        checkpoint.load(run_dir.path)
    with pytest.raises(RecordsChanged, match="changed on disk since this run last wrote it"):
        run_dir.save({"generation": 3})


def test_resume_after_an_interrupt_continues_generations_and_history(small_target, tmp_path):
    config = make_config(small_target, tmp_path, generations=3)
    calls = []

    def judge_then_interrupt(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 7:  # in generation 2: like Ctrl-C
            raise KeyboardInterrupt
        return fake_judge(path, *args, **kwargs)

    assert run(config, **{**STAND_INS, "judge_fn": judge_then_interrupt}) == 130
    run_dir = only_run_dir(config)
    state = checkpoint.load(run_dir)
    assert state["generation"] == 2 and not state["finished"]
    assert (config.workspace / "engine.py").exists()
    rows_before = len(history.read(config.history))
    restored = Search(config, RunDir(config.runs_dir, state["run_id"], target_key(config)), state, **STAND_INS)
    assert all(p.fitness.valid for p in restored.population)  # tournaments need fitness at once
    children = [p for p in restored.population if p.parent_ids]
    assert children and all(made_here(p, {}.get, restored.evaluator.made_here) for p in children)
    restored.pool.executor.shutdown()

    vouched_for = []  # a resumed run holds no lineage from before; its checkpoint says whose code is whose

    def judge_and_see_vouched(path, *args, vouched=(), **kwargs):
        vouched_for.append(source_hash(Path(path).read_text()) in vouched)
        return fake_judge(path, *args, **kwargs)

    assert run(config, state, run_id=state["run_id"], **{**STAND_INS, "judge_fn": judge_and_see_vouched}) == 0
    assert vouched_for and all(vouched_for)
    assert checkpoint.load(run_dir)["spent_s"] > state["spent_s"] > 0  # the budget carries on
    frame = history.read(config.history)
    assert len(frame) > rows_before
    assert set(frame["run_id"]) == {state["run_id"]}
    assert frame["generation"].max() == 4  # generations 2 and 3 re-run, the final choice after
    assert not history.judged_rows(frame)["candidate_id"].duplicated().any()
    assert checkpoint.load(run_dir)["generation"] == 4
    assert "resumed at generation 2" in (config.workspace / "results.log").read_text()


def test_a_second_run_reuses_the_judgements_in_history(small_target, tmp_path):
    config = make_config(small_target, tmp_path, generations=1)
    run(config, **STAND_INS)
    first = history.read(config.history)
    run(config, **STAND_INS)  # same rng seed: same children, all already judged
    second = history.read(config.history)
    new_rows = second.iloc[len(first):]
    assert history.judged_rows(new_rows).empty


def test_seed_from_a_history_takes_its_best_correct_programs(small_target, tmp_path):
    earlier = make_config(small_target, tmp_path / "earlier", generations=2)
    run(earlier, **STAND_INS)
    frame = history.read(earlier.history)
    fitness = frame[frame["status"] == "ok"].groupby("candidate_id")["fitness"].mean()
    best_two = set(fitness.sort_values(ascending=False).index[:2])

    config = make_config(small_target, tmp_path / "later", seed_from=(earlier.history,), seed_from_top=2)
    picked = {args["candidate_id"] for _, args in seed_sources(config)}
    assert picked == best_two
    assert run(config, **STAND_INS) == 0
    later = history.read(config.history)
    gen0 = later[later["generation"] == 0]
    seed_id = gen0.loc[gen0["operator"] == "seed", "candidate_id"].iloc[0]  # the seed is not judged twice
    assert set(gen0.loc[gen0["operator"] == "seed_from", "candidate_id"]) == best_two - {seed_id}


def test_generation_0_judges_the_floor_first_in_full_and_the_rest_beside_it(small_target, tmp_path):
    """The first of the first programs is the floor: judged in full before anything else (a
    budget too short for the rest still returns it); the seed and the others are screened
    beside it, not beside an eager seed 14-29x slower; the fastest of those faster than the
    floor is confirmed beside it, and the final holds it to the floor."""
    seed = Path(make_config(small_target, tmp_path).seed_engine).read_text()
    files = []
    for i in range(4):
        files.append(tmp_path / f"first{i}.py")
        files[-1].write_text(seed + f"stand_in_variant = {i}\n")
    files.sort(key=stand_in_speed)  # the floor is the slowest: others may beat it
    config = make_config(small_target, tmp_path / "later", seed_from=tuple(files[:1] + files[1:][::-1]),
                         generations=1)
    assert run(config, **STAND_INS) == 0
    frame = history.read(config.history)
    gen0 = frame[(frame["generation"] == 0) & (frame["status"] == "ok")]
    first = gen0[gen0["operator"] == "seed_from"]
    floor = first["candidate_id"].iloc[0]
    assert gen0["candidate_id"].iloc[0] == floor and first["level"].iloc[0] == "full"
    assert first["baseline_id"].iloc[0] == ""
    seed_rows = gen0[gen0["operator"] == "seed"]
    assert list(seed_rows["level"]) == ["screen"] and list(seed_rows["baseline_id"]) == [floor]
    assert list(first["level"].iloc[1:]) == ["screen"] * 3 and (first["baseline_id"].iloc[1:] == floor).all()
    confirmed = gen0[gen0["operator"] == "confirm"]
    screened = gen0[gen0["level"] == "screen"]
    fastest = screened.sort_values("fitness")["candidate_id"].iloc[-1]  # the seed too may be faster here
    assert list(confirmed["candidate_id"]) == [fastest] and list(confirmed["baseline_id"]) == [floor]
    finals = frame[frame["operator"] == "final"]
    assert len(finals) and (finals["baseline_id"] == floor).all()  # the final holds contenders to it


def test_generation_0_floors_on_the_first_program_that_passes(small_target, tmp_path):
    """A first program the gate rejects is no floor: the next is judged in full."""
    earlier = make_config(small_target, tmp_path / "earlier", generations=2)
    run(earlier, **STAND_INS)
    config = make_config(small_target, tmp_path / "later", seed_from=(earlier.history,), seed_from_top=4,
                         generations=1)
    seed = Path(config.seed_engine).read_text()
    rejected = next(source for source, _ in seed_sources(config) if source != seed)

    def rejecting_the_first(path, *args, **kwargs):
        verdict = fake_judge(path, *args, **kwargs)
        if Path(path).read_text() == rejected:
            verdict.update(status="incorrect", stage="derived", error="wrong logits", tokens_per_second={})
        return verdict
    # Its judgement of the earlier run is forgotten: a new history.
    assert run(config, **{**STAND_INS, "judge_fn": rejecting_the_first}) == 0
    frame = history.read(config.history)
    first = frame[(frame["generation"] == 0) & (frame["operator"] == "seed_from")]
    assert len(first) >= 3 and list(first["status"]) == ["incorrect"] + ["ok"] * (len(first) - 1)
    floor = first["candidate_id"].iloc[1]
    assert list(first["level"]) == ["full", "full"] + ["screen"] * (len(first) - 2)
    assert list(first["baseline_id"]) == ["", ""] + [floor] * (len(first) - 2)


def test_a_budget_too_short_for_generation_0_returns_the_floor_not_the_seed(small_target, tmp_path):
    """A 5-minute Qwen3-0.6B search judged the seed in full, screened five library programs
    28x faster, and returned the seed: only a program judged in full may win. The floor is
    judged in full first, so it is what such a budget returns."""
    earlier = make_config(small_target, tmp_path / "earlier", generations=2)
    run(earlier, **STAND_INS)
    config = make_config(small_target, tmp_path / "later", seed_from=(earlier.history,), seed_from_top=3,
                         budget_s=1.0)
    floor_source = next(source for source, _ in seed_sources(config) if source != Path(config.seed_engine).read_text())

    def slow_judge(path, *args, **kwargs):
        time.sleep(1.0)  # the budget is spent by the first judgement
        return fake_judge(path, *args, **kwargs)
    assert run(config, **{**STAND_INS, "judge_fn": slow_judge}) == 0
    frame = history.read(config.history)
    assert list(frame.loc[frame["status"] == "ok", "operator"]) == ["seed_from"]  # nothing else started
    engine = (config.workspace / "engine.py").read_text()
    assert f"Engine {Program(floor_source).id}" in engine and "not compared with the seed" in engine


def floor_and_contender():
    """(seed, a library floor 14.3x it, a contender fitted 1.04x the floor, their scores)."""
    seed, floor, contender = Program("seed = 0\n"), Program("floor = 1\n", (), "library"), Program("c = 2\n")
    scores = Scores()
    for program, fitness in ((seed, 7_000.0), (floor, 100_000.0), (contender, 104_000.0)):
        scores.add(program.id, "ok", fitness, 1.0, 1.0, tps={"decode": fitness}, level="full")
    scores.compare(floor.id, seed.id, 14.3, 13.0, 15.6, 3)
    return seed, floor, contender, scores


def test_the_final_keeps_the_floor_unless_a_contender_is_clearly_faster(monkeypatch):
    """Held to the floor head to head: a contender 1.05x it with an interval reaching below 1
    does not displace it (the evaluator had three library programs screened above
    fastest.txt's at 0.91-0.95x it); one whose interval is above 1 does. Beside the seed, a
    ratio above 1 is enough."""
    seed, floor, contender, scores = floor_and_contender()
    final_ratio = {}

    def final_judgements(toolbox, generation, jobs, workers, scores):
        ratio, low, high = final_ratio["now"]
        verdict = {"status": "ok", "ratio": ratio, "ratio_low": low, "ratio_high": high, "rounds": 6,
                   "fitness_cv": 0.02, "tokens_per_second": {"decode": 100_000.0 * ratio},
                   "baseline_tokens_per_second": {"decode": 100_000.0}}
        for program, *_ in jobs:  # as judging.record does
            scores.add(program.id, "ok", 100_000.0 * ratio, 1.0, 1.0, tps=verdict["tokens_per_second"])
        return [(program, 100_000.0 * ratio, verdict) for program, *_ in jobs]

    monkeypatch.setattr(evolve.judging, "run_jobs", final_judgements)
    judging = Judging(SimpleNamespace(merge_every_gain=lambda best, scores: None), scores, 1)
    choose = lambda floor_: final.choose_winner(judging, seed, floor_, [contender], 2, 4, lambda n: True)  # noqa: E731
    final_ratio["now"] = (1.05, 0.98, 1.12)
    winner, ratio, table, how = choose(floor)
    assert winner is floor and ratio == pytest.approx(14.3, rel=0.05) and "kept" in how
    assert table == [("decode", 100_000.0, 7_000.0)]
    assert choose(seed)[0] is contender  # beside the seed, 1.05x is a win
    final_ratio["now"] = (1.05, 1.01, 1.09)
    assert choose(floor)[0] is contender
    # No contender fitted faster than the floor: the floor's closing merge (its gains folded
    # in) is still judged beside it, and wins only when clearly faster.
    judged = []
    monkeypatch.setattr(evolve.judging, "run_jobs", lambda *args: judged.extend(p.id for p, *_ in args[2]) or
                        final_judgements(*args))
    for i, (ratio, wins) in enumerate((((1.05, 1.01, 1.09), True), ((1.02, 0.99, 1.05), False))):
        closing = Program(f"floor = 1\nmerged = {i}\n", (floor.id,), "merge_every_gain")
        merging = SimpleNamespace(merge_every_gain=lambda best, scores: closing if best is floor else None)
        final_ratio["now"] = ratio
        winner = final.choose_winner(Judging(merging, scores, 1), seed, floor, [], 2, 4, lambda n: True)[0]
        assert judged[-1] == closing.id and winner is (closing if wins else floor)


def test_a_contender_slower_with_its_inputs_staged_does_not_replace_the_floor(monkeypatch):
    """The final times each case staged too (the evaluator's protocol): a contender clearly
    faster in the judge's runs but slower staged leaves the floor in place, and results.log
    says so; one not slower staged wins. Only the final is staged."""
    seed, floor, contender, scores = floor_and_contender()
    staged = {}

    def final_judgements(toolbox, generation, jobs, workers, scores):
        verdict = {"status": "ok", "ratio": 1.05, "ratio_low": 1.01, "ratio_high": 1.09, "rounds": 6,
                   "fitness_cv": 0.02, "tokens_per_second": {"decode": 105_000.0},
                   "baseline_tokens_per_second": {"decode": 100_000.0},
                   **dict(zip(("staged_ratio", "staged_ratio_low", "staged_ratio_high"), staged["now"]))}
        return [(program, 105_000.0, verdict) for program, *_ in jobs]

    monkeypatch.setattr(evolve.judging, "run_jobs", final_judgements)
    judging = Judging(SimpleNamespace(merge_every_gain=lambda best, scores: None), scores, 1)
    staged["now"] = (0.97, 0.95, 0.99)
    winner, _, _, how = final.choose_winner(judging, seed, floor, [contender], 2, 4, lambda n: True)
    assert winner is floor and "kept: its best contender beat it in the judge's runs, not with its inputs staged" in how
    assert "inputs staged (the evaluator's protocol) 0.970x" in how
    staged["now"] = (1.00, 0.98, 1.02)
    assert final.choose_winner(judging, seed, floor, [contender], 2, 4, lambda n: True)[0] is contender
    config = RunConfig.build("cpu", model_config="c.json", weight_dir="w")
    assert config.judge_options("full", final=True)["staged"] and not config.judge_options("full")["staged"]
    assert not replace(config, staged_final=False).judge_options("full", final=True)["staged"]


def test_a_final_out_of_budget_keeps_the_floor_unless_a_contender_was_clearly_faster_beside_it():
    """With no time for the final, the fitted speeds alone do not displace the floor: a
    5-minute H200 run returned a library program fitted above it from a screen (1.012x)
    whose full judgement beside it was 0.985x (0.944-1.027). One whose comparison beside
    the floor is clearly above 1 may win, unless finals are staged; beside the seed, the
    fitted speeds decide."""
    seed, floor = Program("seed = 0\n"), Program("floor = 1\n", (), "library")
    screened_above, clearly_above = Program("c = 2\n"), Program("c = 3\n")
    scores = Scores()
    for program, fitness in ((seed, 7_000.0), (floor, 241_993.0), (screened_above, 243_634.0),
                             (clearly_above, 250_000.0)):
        scores.add(program.id, "ok", fitness, 1.0, 1.0, tps={"decode": fitness}, level="full")
    scores.compare(floor.id, seed.id, 30.0, 28.0, 32.0, 3)
    scores.compare(screened_above.id, floor.id, 1.012, 0.980, 1.045, 3)
    scores.compare(screened_above.id, floor.id, 0.985, 0.944, 1.027, 5)
    judging = Judging(SimpleNamespace(merge_every_gain=lambda best, scores: None), scores, 1)
    out_of_budget = lambda n: False  # noqa: E731
    assert scores.speed(screened_above.id) > scores.speed(floor.id)
    winner, ratio, table, how = final.choose_winner(judging, seed, floor, [screened_above], 2, 4, out_of_budget)
    assert winner is floor and "kept" in how and "out of budget" in how
    assert ratio == pytest.approx(scores.gain(floor.id, seed.id)) and table == [("decode", 241_993.0, 7_000.0)]
    scores.compare(clearly_above.id, floor.id, 1.04, 1.01, 1.07, 5)
    assert final.choose_winner(judging, seed, floor, [screened_above, clearly_above], 2, 4, out_of_budget)[0] \
        is clearly_above
    assert final.choose_winner(judging, seed, seed, [screened_above], 2, 4, out_of_budget)[0] is screened_above
    # Where finals are staged, only a final replaces the floor: the judge's own comparisons
    # favour a device-bound program by up to ~10% over the evaluator's.
    winner, ratio, _, how = final.choose_winner(judging, seed, floor, [screened_above, clearly_above], 2, 4,
                                                out_of_budget, staged=True)
    assert winner is floor and "only a final that also times it staged" in how
    assert ratio == pytest.approx(scores.gain(floor.id, seed.id))
    assert final.choose_winner(judging, seed, seed, [screened_above], 2, 4, out_of_budget, staged=True)[0] \
        is screened_above


def test_seed_from_a_run_directory_and_a_file(small_target, tmp_path):
    earlier = make_config(small_target, tmp_path / "earlier", generations=1)
    run(earlier, **STAND_INS)
    engine = tmp_path / "mine.py"
    engine.write_text((earlier.workspace / "engine.py").read_text() + "# mine\n")
    config = make_config(small_target, tmp_path / "later", seed_from=(only_run_dir(earlier), engine))
    sources = [s for s, _ in seed_sources(config)]
    assert sources[0] == (only_run_dir(earlier) / "winner.py").read_text()
    assert sources[-1].endswith("# mine\n")
    with pytest.raises(SettingsError, match="no such"):
        seed_sources(make_config(small_target, tmp_path, seed_from=(tmp_path / "nothing.csv",)))


def test_a_finished_runs_programs_are_vouched_for_as_its_checkpoint_says(small_target, tmp_path):
    """--seed-from runs/RUN or its history.csv: the programs that run found made here (its
    checkpoint's made_here) keep that word, so their kernels still join the shared cache; an
    unfinished run's checkpoint, or a program it did not find so, is not taken at its word."""
    outside = tmp_path / "outside.py"
    outside.write_text(SEED_ENGINE.read_text() + "stand_in_outside = 1\n")  # 1,002 tok/s: seldom a parent
    earlier = make_config(small_target, tmp_path / "earlier", generations=2, seed_from=(outside,),
                          seed_from_top=10)  # a hall of fame of 10: programs of both lineages
    run(earlier, mutate_fn=random_mutation, mate_fn=crossover, judge_fn=fake_judge)
    state = checkpoint.load(only_run_dir(earlier))
    said = set(state["made_here"])
    config = make_config(small_target, tmp_path / "later", seed_from=(only_run_dir(earlier),), seed_from_top=10)
    programs, _ = initial_population(config, Program)
    taken = [p for p in programs if p.operator == "seed_from"]
    assert taken and {made_here(p, {}.get) for p in taken} == {True, False}  # of both kinds
    assert all(made_here(p, {}.get) == (p.id in said) for p in taken)
    from_history = make_config(small_target, tmp_path / "later", seed_from=(earlier.history,), seed_from_top=10)
    programs, _ = initial_population(from_history, Program)
    taken = [p for p in programs if p.operator == "seed_from"]
    assert {made_here(p, {}.get) for p in taken} == {True, False}
    assert all(made_here(p, {}.get) == (p.id in said) for p in taken)
    state["finished"] = False
    only_run_dir(earlier).joinpath(checkpoint.CHECKPOINT).write_bytes(pickle.dumps(state))
    for later in (config, from_history):
        programs, _ = initial_population(later, Program)
        assert not any(made_here(p, {}.get) for p in programs if p.operator == "seed_from")


def test_only_programs_of_the_repositorys_code_are_vouched_for(small_target, tmp_path):
    """The judge adds a runner's compiled kernels to the shared cache only for programs the
    search vouches for: the seed's lineage, never a --seed-from program's nor any program
    with one among its ancestors (its code came from outside and could plant a kernel)."""
    outside = tmp_path / "outside.py"
    outside.write_text(SEED_ENGINE.read_text() + "stand_in_outside = 456\n")  # 1,996 tok/s: a parent often
    vouched_for = {}

    def judge_fn(path, *args, vouched=(), **options):
        vouched_for[source_hash(Path(path).read_text())] = source_hash(Path(path).read_text()) in vouched
        return fake_judge(path, *args, **options)

    config = make_config(small_target, tmp_path, seed_from=(outside,), generations=3)
    run(config, mutate_fn=random_mutation, mate_fn=crossover, judge_fn=judge_fn)
    frame = history.read(config.history)
    rows = frame[frame["candidate_id"] != ""].drop_duplicates("candidate_id").set_index("candidate_id")

    def from_outside(candidate_id) -> bool:
        row = rows.loc[candidate_id]
        parents = [p for p in str(row.parent_ids).split(";") if p]
        return row.operator == "seed_from" or any(from_outside(p) for p in parents)

    expected = {cid: not from_outside(cid) for cid in vouched_for}
    assert vouched_for == expected
    children = rows.index[rows["operator"] != "seed_from"]
    assert {expected[cid] for cid in children if cid in expected} == {True, False}  # both kinds were judged


def test_a_gpu_run_says_which_seed_from_programs_compile_their_kernels_anew(small_target, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(SEED_ENGINE.read_text() + "stand_in_outside = 1\n")
    programs, _ = initial_population(make_config(small_target, tmp_path, seed_from=(outside,)), Program)
    line = outside_code_line(programs)
    assert line.startswith(f"--seed-from {outside}: code from outside") and "compiles its Triton kernels anew" in line
    assert outside_code_line(initial_population(make_config(small_target, tmp_path), Program)[0]) is None


def test_each_row_says_what_its_runners_went_without(small_target, tmp_path):
    def judge_fn(path, *args, **options):
        return {**fake_judge(path, *args, **options), "open_layers": "files: no mount namespace"}

    config = make_config(small_target, tmp_path, generations=1)
    run(config, **{**STAND_INS, "judge_fn": judge_fn})
    judged = history.judged_rows(history.read(config.history))
    assert len(judged) and (judged["open_layers"] == "files: no mount namespace").all()


def test_a_program_with_an_ancestor_not_known_is_not_vouched_for():
    """A lineage the search can walk back to the seed neither through its memo nor through
    what it decided before (a resumed run's checkpoint) counts as code from outside."""
    seed, outside = Program("a = 1\n"), Program("a = 9\n", (), "seed_from")
    child = Program("a = 2\n", (seed.id,), "stand_in_comment")
    crossed = Program("a = 3\n", (child.id, outside.id), "stand_in_crossover")
    known = {p.id: p for p in (seed, outside, child)}.get
    assert made_here(child, known) and not made_here(child, {}.get)
    assert made_here(child, {}.get, {seed.id: True}) and not made_here(crossed, known, {child.id: False})
    assert not made_here(crossed, known) and not made_here(outside, known)


def test_nsga2_runs_on_both_objectives(small_target, tmp_path):
    config = make_config(small_target, tmp_path, nsga2=True)
    assert run(config, **STAND_INS) == 0
    state = checkpoint.load(only_run_dir(config))
    assert state["generation"] == 3 and len(state["population"]) == 4


def test_the_budget_stops_the_search(small_target, tmp_path, capsys):
    """And says why, with the time left and what would not have fitted."""
    def slow_judge(*args, **kwargs):
        time.sleep(0.2)
        return fake_judge(*args, **kwargs)

    config = make_config(small_target, tmp_path, generations=None, budget_s=3.0)
    started = time.monotonic()
    assert run(config, **{**STAND_INS, "judge_fn": slow_judge}) == 0
    assert time.monotonic() - started < 6.0
    assert checkpoint.load(only_run_dir(config))["spent_s"] < 6.0
    out = capsys.readouterr().out.splitlines()
    stopped = [line for line in out if line.endswith("stopping the search")]
    assert len(stopped) == 1 and "left: a round of screens and a confirmation (~" in stopped[0], stopped
    assert out[-1] in (f"0m0{s}s of the 0m03s budget spent" for s in range(6)), out[-1]  # the last word


def test_settings_are_validated_with_messages(small_target, tmp_path):
    with pytest.raises(SettingsError, match="population"):
        make_config(small_target, tmp_path, population=0)
    with pytest.raises(SettingsError, match="num_elite"):
        make_config(small_target, tmp_path, population=2, num_elite=2)
    with pytest.raises(SettingsError, match="duration"):
        parse_duration("ten minutes")
    assert parse_duration("10m") == 600 and parse_duration("90") == 90 and parse_duration("1.5h") == 5400
    config = make_config(small_target, tmp_path)
    with pytest.raises(Exception):
        object.__setattr__  # noqa: B018 (frozen: assignment below must fail)
        config.population = 9


def test_history_skips_a_damaged_line_with_a_warning(tmp_path):
    path = tmp_path / "history.csv"
    hist = history.History(path)
    hist.append({"run_id": "r", "generation": 0, "candidate_id": "a", "operator": "seed", "status": "ok",
                 "fitness": 5.0})
    with open(path, "a") as f:
        f.write("r,1,b,a,op,{},ok,,0.1,1,2\n")  # cut short (a run killed mid-row)
    hist = history.History(path)  # the next run's
    hist.append({"run_id": "r", "generation": 1, "candidate_id": "c", "parent_ids": ("a",),
                 "operator": "op", "status": "incorrect", "fitness": 0.0, "error": "line one\nline two"})
    warnings = []
    frame = history.read(path, warn=warnings.append)
    assert list(frame["candidate_id"]) == ["a", "c"]
    assert len(warnings) == 1 and ":3:" in warnings[0]
    assert frame["error"].iloc[1] == "line one ... line two"


def test_checkpoint_is_plain_data(small_target, tmp_path):
    config = make_config(small_target, tmp_path, generations=1)
    run(config, **STAND_INS)
    raw = (only_run_dir(config) / checkpoint.CHECKPOINT).read_bytes()
    state = pickle.loads(raw)
    assert {"population", "hall_of_fame", "rng_state", "spent_s", "generation", "config"} <= set(state)
    assert all(isinstance(p["source"], str) for p in state["population"])


def test_judgements_that_would_start_after_the_budget_are_skipped(small_target, tmp_path):
    seed = SEED_ENGINE.read_text()

    def judge_slower_after_the_seed(path, *args, **kwargs):
        time.sleep(0.05 if open(path).read() == seed else 2.0)  # every child: one that fails too
        return fake_judge(path, *args, **kwargs)

    # Generation 0 takes 0.8 s alone and over 1.9 s on a loaded 2-core CI machine: with L
    # seconds left after it, generation 1 starts ceil(L / 2) of its four children, 1 to 3.
    config = make_config(small_target, tmp_path, generations=None, budget_s=5.0, crossover_prob=0.0)
    started = time.monotonic()
    assert run(config, **{**STAND_INS, "judge_fn": judge_slower_after_the_seed}) == 0
    assert time.monotonic() - started < 9.0
    frame = history.read(config.history)
    assert 1 <= len(history.judged_rows(frame[frame["generation"] == 1])) < 4  # the rest skipped
    assert (config.workspace / "engine.py").exists()


def test_no_batch_but_the_final_starts_inside_the_final_s_reserve(small_target, tmp_path):
    config = make_config(small_target, tmp_path, budget_s=60.0)
    search = Search(config, RunDir(config.runs_dir, "reserve", target_key(config)), **STAND_INS)
    worker = search.pool.workers[0]
    search.evaluator.final_reserve = lambda: 120.0  # more than the budget has left
    assert search.evaluator(ProgramBatch((search.seed,), None, "full", None), 1, worker) == [(None, None)]
    (fitness, verdict), = search.evaluator(ProgramBatch((search.seed,), FINAL, "full", None), 1, worker)
    assert verdict["status"] == "ok" and fitness > 0
    asked = []
    search.evaluator.judge_fn = lambda *args, **options: asked.append(options) or fake_judge(*args, **options)
    search.evaluator.final_reserve = lambda: 20.0
    (fitness, verdict), = search.evaluator(ProgramBatch((search.seed,), None, "screen", None), 1, worker)
    assert verdict["status"] == "ok"
    assert 30.0 < asked[-1]["rounds_within"] <= 40.0  # its rounds end before the final's reserve
    search.evaluator(ProgramBatch((search.seed,), FINAL, "full", None), 1, worker)
    assert 50.0 < asked[-1]["rounds_within"] <= 60.0  # the final's rounds end with the budget
    # A label names a re-judgement: the first row of a program judged first in the final
    # (the closing merge) names its operator.
    frame = history.read(config.history)
    assert list(frame.loc[frame["status"] != "declined", "operator"]) == ["seed", "seed", "final"]


def test_a_generation_s_children_leave_time_for_a_merge_a_confirmation_and_the_final(small_target, tmp_path):
    """A child that could be a gain is no use unless it can still be merged, confirmed and
    compared: past a generation's first batch on each worker (which should_continue let it
    start for), its children's batches keep that time back (a GPU sweep beside a slow seed
    took all but 30 s of a 20-minute run)."""
    config = make_config(small_target, tmp_path, budget_s=80.0)  # one worker
    search = Search(config, RunDir(config.runs_dir, "sweep", target_key(config)), **STAND_INS)
    make = search.toolbox.individual
    other = make(search.seed.source + "\n# another program\n", (search.seed.id,), "op", {})
    for program in (search.seed, other):  # each 40 s in full: a confirmation and a final of one, 90 s
        search.scores.add(program.id, "ok", 100.0, 1.0, 40.0, level="full")
    first = make(search.seed.source + "\n# a child\n", (search.seed.id,), "op", {})
    second = make(other.source + "\n# a child\n", (other.id,), "op", {})  # another parent: another batch
    assert search.final_reserve_s() == 0.0  # no contender: nothing to keep the final's time for
    judged = []
    search.evaluator.judge_fn = lambda path, *args, **options: judged.append(Path(path).stem) or fake_judge(
        path, *args, **options)
    search.screen_children(1, [first, second])
    assert judged == [first.id]  # the first batch; then under 80 s left
    assert second.id not in search.scores
    assert search.final_reserve_s() == 0.0  # only while children are screened
    search.screen(1, [second])  # outside a generation's children it starts
    assert judged == [first.id, second.id]


def test_one_worker_per_visible_gpu_pinned_by_cuda_visible_devices(small_target, tmp_path, monkeypatch):
    monkeypatch.setattr(evolve.config, "visible_gpus", lambda: ["2", "5"])  # the worker count
    monkeypatch.setattr(evolve.judging, "visible_gpus", lambda: ["2", "5"])  # the pinning
    config_path, weight_dir = small_target
    config = RunConfig.build("cuda", model_config=config_path, weight_dir=weight_dir)
    assert config.workers == 2 and config.bench == "all"
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in make_workers(config)] == ["2", "5"]
    assert make_workers(config)[1].device_name("cuda") == "cuda:5"
    cpu = make_config(small_target, tmp_path, workers=2)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    workers = make_workers(cpu)
    assert [w.cpus for w in workers] == [[0, 1], [2, 3]]  # cores of their own, none shared
    assert all(w.env["OMP_NUM_THREADS"] == "1" for w in workers)  # CPU judges: one thread each


def test_children_are_screened_beside_a_parent_and_the_final_is_fresh_beside_the_seed(small_target, tmp_path):
    calls = []

    def recording_judge(path, *args, **kwargs):
        calls.append((Path(path).stem, kwargs["level"], kwargs["baseline"] and Path(kwargs["baseline"]).stem,
                      kwargs["seed"]))
        return fake_judge(path, *args, **kwargs)

    config = make_config(small_target, tmp_path, final_top=2)
    run(config, **{**STAND_INS, "judge_fn": recording_judge})
    frame = history.read(config.history)
    seed_id = frame.loc[frame["operator"] == "seed", "candidate_id"].iloc[0]  # after the library's declines
    assert calls[0] == (seed_id, "full", None, calls[0][3])  # the seed: in full, alone
    gate_seed = calls[0][3]
    first = history.judged_rows(frame).iloc[1:]
    for row in first.itertuples():  # every child screened beside its first parent
        assert row.level == "screen" and row.baseline_id == row.parent_ids.split(";")[0]
    final = [c for c in calls if c[3] != gate_seed]  # fresh gate traces: the final only
    assert final and all(level == "full" and baseline == seed_id for _, level, baseline, _ in final)
    assert len(final) == (frame["operator"] == "final").sum()
    log = (config.workspace / "results.log").read_text()
    assert "interleaved rounds" in log and "confident it is faster" in log and "CV of its fitness" in log


def test_a_seed_judged_wrong_stops_the_search_with_its_reason(small_target, tmp_path):
    def everything_wrong(path, *args, **kwargs):
        verdict = fake_judge(path, *args, **kwargs)
        verdict.update(status="crash", stage="target", error="FileNotFoundError: no such weights")
        return verdict

    config = make_config(small_target, tmp_path, generations=3)
    assert run(config, **{**STAND_INS, "judge_fn": everything_wrong}) == 0
    frame = history.read(config.history)
    assert len(history.judged_rows(frame)) == 1  # the seed alone: no child judged against it
    log = (config.workspace / "results.log").read_text()
    assert "the seed engine failed its judgement (crash: FileNotFoundError: no such weights)" in log


def test_a_seed_over_the_tolerance_names_the_margin_and_the_margin_reaches_the_judge(small_target, tmp_path):
    """A deep fp16 model can round past the tolerance in the seed itself
    (docs/log/2026-11-23-rope-rows-swiglu-gate-at-1b-depth.md): the stop says which flag lets
    the gate allow more, and that flag reaches every judgement."""
    margins = []

    def seed_over_tolerance(path, *args, margin, **kwargs):
        margins.append(margin)
        verdict = fake_judge(path, *args, **kwargs)
        verdict.update(status="incorrect", stage="target", error="target/public/single_prefill#0: error 1.03 x "
                       "tolerance (limit 0.8)")
        return verdict

    config = make_config(small_target, tmp_path, generations=3, margin=0.8)
    assert run(config, **{**STAND_INS, "judge_fn": seed_over_tolerance}) == 0
    assert margins == [0.8]
    log = (config.workspace / "results.log").read_text()
    assert "error 1.03 x tolerance (limit 0.8); the seed does the reference's math" in log
    assert "--margin 1.6 would let the gate allow more" in log
    with pytest.raises(SettingsError, match="margin must be > 0"):
        make_config(small_target, tmp_path, margin=0.0)


def test_a_program_that_fails_beside_others_is_judged_again_alone(small_target, tmp_path):
    """A crash in a batch may be a neighbour's doing (they share the GPU's memory): only
    the verdict of a judgement alone is recorded."""
    calls = {}

    def crowded_judge(path, *args, **kwargs):
        calls[path] = calls.get(path, 0) + 1
        verdict = fake_judge(path, *args, **kwargs)
        if kwargs.get("baseline") and calls[path] == 1:
            verdict.update(status="crash", stage="target", error="CUDA out of memory", tokens_per_second={})
        return verdict

    # On a GPU (runners share the card's memory); the stand-in judge needs none. From the
    # seed alone: replaying the library's GPU recipes took 25 s and is not the subject here.
    given = {k: v for k, v in vars(make_config(small_target, tmp_path, generations=1)).items() if k != "device"}
    config = RunConfig.build("cuda", **{**given, "library": False})
    assert run(config, **{**STAND_INS, "judge_fn": crowded_judge}) == 0
    judged = history.judged_rows(history.read(config.history))
    assert len(judged) > 2 and "crash" not in set(judged["status"])
    screened = judged[judged["level"] == "screen"]
    assert len(screened) and all(calls[Path(p)] >= 2 for p in screened["source_path"])  # once in its batch, once alone


def test_the_final_choice_weighs_the_contenders_paired_comparison_not_their_ratios_alone(monkeypatch):
    """An H100 search's final drew a child measured 1.24x and 1.17x its parent, paired, level
    with that parent beside the seed (16.38x against 16.53x, the child's interval 8.8-30x);
    choosing by that ratio alone kept the parent."""

    seed, parent = Program("seed = 0\n"), Program("parent = 1\n")
    child = Program("child = 2\n", (parent.id,))
    scores = Scores()
    for program, fitness in ((seed, 7_000.0), (parent, 110_000.0), (child, 130_000.0)):
        scores.add(program.id, "ok", fitness, 1.0, 1.0, level="full")
    scores.compare(child.id, parent.id, 1.243, 1.204, 1.284, 3)
    scores.compare(child.id, parent.id, 1.175, 0.862, 1.600, 4)
    finals = {parent.id: (16.53, 15.50, 17.62), child.id: (16.38, 8.85, 30.34)}

    def final_judgements(toolbox, generation, jobs, workers, scores):
        results = []
        for program, *_ in jobs:
            ratio, low, high = finals[program.id]
            verdict = {"status": "ok", "ratio": ratio, "ratio_low": low, "ratio_high": high, "rounds": 3,
                       "fitness_cv": 0.1, "tokens_per_second": {"decode": 7_000.0 * ratio},
                       "baseline_tokens_per_second": {"decode": 7_000.0}}
            scores.add(program.id, "ok", 7_000.0 * ratio, 1.0, 1.0, level="full")  # as judging.record does
            scores.compare(program.id, seed.id, ratio, low, high, 3)
            results.append((program, 7_000.0 * ratio, verdict))
        return results

    monkeypatch.setattr(evolve.judging, "run_jobs", final_judgements)
    nothing_to_merge = SimpleNamespace(merge_every_gain=lambda best, scores: None)

    def choose(toolbox, fits=lambda n: True):
        return final.choose_winner(Judging(toolbox, scores, 1), seed, seed, [child, parent], 2, 4, fits)
    winner, ratio, table, how = choose(nothing_to_merge)
    assert winner is child and ratio == 16.38 and table == [("decode", 7_000.0 * 16.38, 7_000.0)]
    assert "16.380x the seed" in how
    finals[child.id] = finals[parent.id] = (0.9, 0.8, 1.0)  # none beats the seed: the seed wins
    assert choose(nothing_to_merge)[0] is seed
    # The closing merge: the best with the gains it lacks, judged first in the final, second
    # in line (before the best's runner-up when only two fit), and the winner when faster.
    closing = Program("child = 2\nmerged = 3\n", (child.id, parent.id), "merge_every_gain")
    merging = SimpleNamespace(merge_every_gain=lambda best, scores: closing if best is child else None)
    finals.update({child.id: (16.38, 15.0, 17.9), parent.id: (16.53, 15.5, 17.6), closing.id: (19.0, 17.5, 20.6)})
    judged = []
    monkeypatch.setattr(evolve.judging, "run_jobs", lambda *args: judged.extend(p.id for p, *_ in args[2]) or
                        final_judgements(*args))
    winner, ratio, _, _ = choose(merging, fits=lambda n: 250.0 >= 100.0 * n)  # two fit
    assert judged == [child.id, closing.id] and winner is closing and ratio == 19.0


def test_near_equal_programs_are_ranked_by_their_paired_comparisons_not_their_ratios_to_a_slow_seed():
    """An H100 search on Llama-3.2-1B's shape
    (docs/log/2026-11-27-llama-20-minute-search-todays-tree.md): the Qwen3
    library program L read 15.2x, then 14.1x the eager seed; A, L plus one constant, level
    with L twice (1.004x, 1.001x, paired) but 12.4x the seed in the final (interval
    11.6-13.2x); B, L's merge, 0.995x L once and 14.0x the seed (9.9-19.9x). With each
    ratio to the seed trusted to its own rounds, the fit put B above A and the final chose
    B; the ratios' drift between judgements puts A, whose paired evidence is the stronger,
    level with L and above B."""
    seed, lib, a, b = (Program(f"p = {i}\n") for i in range(4))
    scores = Scores()
    for program, fitness in ((seed, 3_024.3), (lib, 44_569.6), (lib, 44_679.7), (a, 44_768.4), (a, 45_329.7),
                             (a, 45_228.8), (b, 44_401.9), (b, 44_653.0)):
        scores.add(program.id, "ok", fitness, 1.0, 1.0, level="full")
    for x, y, ratio, low, high, rounds in ((lib, seed, 15.226, 13.062, 17.748, 3), (lib, seed, 14.133, 13.223, 15.105, 3),
                                           (a, lib, 1.004, 0.970, 1.040, 3), (a, lib, 1.001, 0.977, 1.026, 5),
                                           (b, lib, 0.995, 0.962, 1.029, 3), (a, seed, 12.391, 11.612, 13.223, 3),
                                           (b, seed, 14.024, 9.885, 19.897, 3)):
        scores.compare(x.id, y.id, ratio, low, high, rounds)
    assert scores.speed(a.id) > scores.speed(b.id)
    assert scores.gain(a.id, lib.id) == pytest.approx(1.0, abs=0.005)


def reckoning_search(gains: dict, phases: dict | None = None) -> SimpleNamespace:
    """Search's estimates over a hall of fame of `best` and the seed (the floor), whose full
    judgements took 40 s each, and batches of `phases` (level -> [BatchPhases]))."""
    seed, best = SimpleNamespace(id="seed"), SimpleNamespace(id="best")
    fake = SimpleNamespace(
        seed=seed, floor=seed, hall_of_fame=[best, seed], evaluator=SimpleNamespace(batch_phases=phases or {}),
        scores=SimpleNamespace(gain=lambda a, b: gains[a], mean_judge_seconds=lambda **_: 40.0,
                               is_ok=lambda _: True, speed=lambda a: {"seed": 1.0, "best": gains["best"]}[a]),
        config=SimpleNamespace(final_top=2, workers=1, final_rounds=12, max_rounds=5, staged_final=False,
                               device="cuda"))
    fake.final_contenders = lambda: Search.final_contenders(fake)
    fake.device_kind = lambda: Search.device_kind(fake)
    fake.full_judgement_parts = lambda: Search.full_judgement_parts(fake)
    return fake


def test_the_final_is_reckoned_longer_only_for_a_close_call():
    """As long as a confirmation; for each further contender a quarter more untimed and half
    more timing (a runner beside the floor's and the first's). The timing (half of it when
    the judge did not say) up to final_rounds' worth longer only when the best is within
    CLEAR_GAIN of the seed (an 8-minute H100 search skipped a generation that fitted: its
    final, reckoned at 77 s, took 36); twice as long when it is staged too."""
    gains = {"best": 15.0}
    fake = reckoning_search(gains)
    assert Search.estimated_final_s(fake, 1) == 40.0
    assert Search.estimated_final_s(fake, 2) == 1.25 * 20.0 + 1.5 * 20.0
    # Two of the hall of fame and the closing merge: three in the batch, though final_top is
    # 2 (H100 finals of three, reckoned as two, took 122 and 154 s where 89 and 79 s were
    # left; an H200 one, reckoned with a quarter more timing each, 130 s for 114).
    assert Search.estimated_final_s(fake, 3) == 1.5 * 20.0 + 2 * 20.0
    fake.config.workers = 3  # one on each worker, side by side
    assert Search.estimated_final_s(fake, 3) == 40.0
    fake.config.workers = 1
    assert Search.estimated_final_s(fake) == 40.0  # the reserve: the hall of fame's one contender
    best, seed = fake.hall_of_fame
    fake.hall_of_fame = [seed]  # none yet: a final of the closing merge alone (a close call), not 3/4 of one
    assert Search.estimated_final_s(fake) == pytest.approx(20.0 + 20.0 * (1 + (12 / 5 - 1) / 4))
    fake.hall_of_fame = [best, seed]
    gains["best"] = 1.05  # a close call: 12 rounds allowed where a confirmation has 5
    longer = 1 + (12 / 5 - 1) / 4
    assert Search.estimated_final_s(fake, 1) == pytest.approx(20.0 + 20.0 * longer)
    fake.config.staged_final = True  # every timed run twice
    assert Search.estimated_final_s(fake, 1) == pytest.approx(20.0 + 2 * 20.0 * longer)
    fake.config.device = "cpu"  # where a close final runs every round it may (5 and 6 of 6 beside the seed)
    assert Search.estimated_final_s(fake, 1) == pytest.approx(20.0 + 2 * 20.0 * 12 / 5)


def test_the_final_is_reckoned_at_the_cheapest_gate_and_the_most_references():
    """A final's contenders are confirmed, their kernels compiled: the floor's first full
    judgement (82 s, its gate 64 s compiling for every config) reckoned an 8-minute H200 run's
    final at 77 s, which took 31 (its gate 7 s). So the gate is the cheapest so far, plus the
    most any paid for references (the final's traces are its own: a 2-core CPU's final gate
    took 21 s against its confirmations' 12); the timing and the rest their means, the timing
    stretched as the final's rounds."""
    phases = {"full": [BatchPhases(81.6, 63.7, 10.7, 9.0), BatchPhases(20.4, 6.1, 13.9, 0.0),
                       BatchPhases(50.1, 39.9, 9.7, 0.0)],
              "screen": [BatchPhases(26.5, 1.0, 13.9, 0.0)]}  # screens gate one config: not the final's
    fake = reckoning_search({"best": 15.0}, phases)
    gate, timing, rest = 6.1 + 9.0, (10.7 + 13.9 + 9.7) / 3, (7.2 + 0.4 + 0.5) / 3
    assert Search.estimated_final_s(fake, 1) == pytest.approx(gate + rest + timing)
    fake.config.staged_final = True
    assert Search.estimated_final_s(fake, 1) == pytest.approx(gate + rest + 2 * timing)
    assert Search.estimated_final_s(fake, 2) == pytest.approx(1.25 * (gate + rest) + 1.5 * 2 * timing)


def test_each_judged_batch_says_how_it_went():
    """A line a batch on the console: what was judged, how many passed and how the others
    failed, the fastest, the batch's seconds and the time left; a program the budget left
    unjudged is not counted."""
    a, b, c, d = (SimpleNamespace(id=x) for x in "abcd")
    results = [(250_000.0, {"status": "ok"}), (None, {"status": "incorrect"}), (275_175.4, {"status": "ok"}),
               (None, None)]
    line = progress_line(3, ProgramBatch((a, b, c, d), None, "screen", "p"), results, 96.6, 850.0)
    assert line == "  gen   3 | screen of 3: 2 ok, 1 incorrect, best 275,175 tok/s [c] | 97 s | 14m10s left"
    final_line = progress_line(6, ProgramBatch((a,), FINAL, "full", "p"), [(None, {"status": "timeout"})], 130.2, 0.0)
    assert final_line == "  gen   6 | final of 1: 0 ok, 1 timeout | 130 s | 0m00s left"
