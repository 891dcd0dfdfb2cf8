"""The library of recipes: what each was judged on, the recipes a run takes for its target,
the ones it declines and why, and a winner written back (CPU, seconds)."""
import json

import pytest

from contract.loader import source_hash
from evolve import history, library
from evolve.__main__ import build_parser, given_settings
from evolve.config import RunConfig
from evolve.population import initial_population
from evolve.program import Program, made_here
from evolve.recipe import first_lines, lineage_recipe
from evolve.workspace import describe_step
from fitness.gate import static_problems
from mutations import recipe
from tests.conftest import REPO, SEED_ENGINE

SEED = SEED_ENGINE.read_text()
PAGED = "allele.KVCache.paged"


def small_config(small_target, tmp_path, **changes):
    config_path, weight_dir = small_target
    return RunConfig.build("cpu", model_config=config_path, weight_dir=weight_dir, history=tmp_path / "history.csv",
                           runs_dir=tmp_path / "runs", **changes)


def write_recipe(folder, name, lines, **judged):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(library.judged_lines(judged) + lines) + "\n")


def test_every_shipped_recipe_says_what_it_was_judged_on_and_reads_back_as_written():
    shipped = library.read_all([library.SHIPPED])
    assert {"fastest.txt", "h100_20261125_e7c360ba.txt"} <= {r.name for r in shipped}
    for entry in shipped:
        assert entry.steps, entry.name
        assert entry.judged["device"] == "cuda" and entry.judged["dtype"] in ("float16", "bfloat16"), entry.name
        assert set(entry.judged["model"]) == set(library.SHAPE_KEYS), entry.name
        assert library.judged_on("\n".join(library.judged_lines(entry.judged))) == entry.judged
    # A hash of digits and one e is no float; a config that lacks a shape key says None.
    odd = {"candidate": "59675999e6736123", "run": "20261125", "model": {"intermediate_size": None, "hidden_size": 2048}}
    assert library.judged_on("\n".join(library.judged_lines(odd))) == odd
    # A bf16 run on the toy model's shape starts from the bf16 searches' winner with the
    # highest recorded figures, an fp16 one from the hand-kept recipe.
    shape = json.loads((REPO / "target" / "model_config.json").read_text())
    firsts = [library.ranked(shipped, library.RunTarget("cuda", shape, dtype))[0].name
              for dtype in ("bfloat16", "float16")]
    assert firsts == ["h100_20261126_729bb0cd.txt", "fastest.txt"]


@pytest.mark.parametrize("name", sorted(p.name for p in library.SHIPPED.glob("*.txt") if p.name != "fastest.txt"))
def test_every_shipped_recipe_replays_on_the_seed(name):
    """What a GPU run's generation 0 does with each (fastest.txt: tests/test_recipes.py). A
    recipe whose lines no longer replay is declined there, silently but for history.csv:
    four were, for a session, when an allele's matmul sites moved."""
    source = recipe.apply(list(library.read(library.SHIPPED / name).steps), SEED)
    assert static_problems(source) == []


def test_recipes_closest_to_the_target_come_first_then_the_fastest():
    target = library.RunTarget("cuda", {"hidden_size": 768}, "float16")
    def entry(name, **judged):
        return library.Recipe(library.SHIPPED / name, (), judged)
    other_shape = entry("other.txt", device="cuda", model={"hidden_size": 2048}, dtype="float16",
                        tokens_per_s={"prefill": 9e6})
    slow, fast = (entry(f"{n}.txt", device="cuda", model={"hidden_size": 768}, dtype="float16",
                        tokens_per_s={"prefill": tps, "decode": tps}) for n, tps in (("slow", 1e5), ("fast", 2e5)))
    unknown = entry("unknown.txt")
    assert [r.name for r in library.ranked([unknown, other_shape, slow, fast], target)] == \
        ["fast.txt", "slow.txt", "other.txt", "unknown.txt"]
    # The hand-kept recipe leads its equals whatever other runs recorded for them: the
    # searches are measured against it, and figures recorded by different runs disagree
    # (5a926216's read 25% under fastest.txt's; side by side it ran at 0.99x).
    kept = entry("fastest.txt", device="cuda", model={"hidden_size": 768}, dtype="float16",
                 tokens_per_s={"prefill": 5e4, "decode": 5e4})
    assert [r.name for r in library.ranked([fast, slow, kept, other_shape], target)] == \
        ["fastest.txt", "fast.txt", "slow.txt", "other.txt"]


@pytest.mark.parametrize("model, first", [("tiny_qwen3_moe", "qwen3_moe_by_hand.txt"),
                                          ("tiny_qwen3_5_moe", "qwen3_5_by_hand.txt")])
def test_a_recipe_of_the_target_s_structure_leads_those_of_dense_models(model, first, tmp_path):
    """For a Qwen3-MoE target on a GPU the library took four dense recipes, their recorded
    figures higher, and declined qwen3_moe_by_hand.txt: the structure (the MoE, the DeltaNet
    layers) now ranks before the shape. A recipe that names none was judged on a dense model."""
    from target import hf_checkpoints
    folder = hf_checkpoints.write(tmp_path, model)
    config = RunConfig.build("cuda", model_config=folder / "config.json", weight_dir=folder,
                             history=tmp_path / "history.csv")
    target = library.RunTarget.of(config)
    assert library.ranked(library.read_all([library.SHIPPED]), target)[0].name == first
    assert target.closeness({"device": "cuda"})[1] is False  # no structure line: dense
    dense = library.RunTarget.of(RunConfig.build("cuda", model_config=REPO / "target" / "model_config.json",
                                                 weight_dir=folder, history=tmp_path / "history.csv"))
    assert dense.structure == library.DENSE and dense.closeness({"device": "cuda"})[1] is True


def test_a_config_written_by_transformers_5_is_matched_by_its_dtype(tmp_path):
    """transformers 5 writes `dtype`, not `torch_dtype`: the run's dtype is what the loader reads
    (it was taken to be float16, and the bf16 recipes of the target's shape ranked below)."""
    from target import hf_checkpoints
    folder = hf_checkpoints.write(tmp_path, "tiny_qwen3_moe")
    raw = json.loads((folder / "config.json").read_text())
    raw["dtype"] = raw.pop("torch_dtype")
    (folder / "config.json").write_text(json.dumps(raw))
    config = RunConfig.build("cuda", model_config=folder / "config.json", weight_dir=folder,
                             history=tmp_path / "history.csv")
    assert library.RunTarget.of(config).dtype == "bfloat16"


def test_a_cpu_run_takes_what_replays_there_and_declines_the_rest_with_the_reason(small_target, tmp_path):
    config = small_config(small_target, tmp_path, library_dir=tmp_path / "lib")
    target = library.RunTarget.of(config)
    write_recipe(config.library_dir, "paged.txt", [PAGED], device="cpu", model=target.model, dtype=target.dtype)
    write_recipe(config.library_dir, "again.txt", [f"{PAGED}  # the same program"])
    write_recipe(config.library_dir, "broken.txt", ['tune_constant {"constant": "NOPE", "new": 3}'])
    write_recipe(config.library_dir, "garbled.txt", ["tune_constant {not json"])
    taken, declined = library.seed_programs(config, SEED)
    assert taken == [(recipe.apply([recipe.RecipeStep(PAGED)]), {"recipe": str(config.library_dir / "paged.txt"),
                                                           "steps": [PAGED]})]
    reasons = dict(declined)
    assert reasons["again.txt"] == "makes the same program as paged.txt"
    assert reasons["broken.txt"].startswith("does not replay on the seed: line 1: tune_constant declined")
    assert reasons["garbled.txt"].startswith("does not parse: line 1: the args of tune_constant are not JSON")
    shipped = {r.name for r in library.read_all([library.SHIPPED])}
    assert all(reasons[name].startswith("needs a GPU: ") for name in shipped)
    assert library.seed_programs(small_config(small_target, tmp_path, library=False), SEED) == ([], [])


def test_a_seed_from_program_a_recipe_also_makes_is_vouched_for_and_named_by_its_recipe(small_target, tmp_path):
    """A --seed-from file holding what a recipe makes is the repository's code: its kernels
    may join the shared cache (evolve.program.made_here), and its lineage is that recipe."""
    config = small_config(small_target, tmp_path, library_dir=tmp_path / "lib")
    target = library.RunTarget.of(config)
    write_recipe(config.library_dir, "paged.txt", [PAGED], device="cpu", model=target.model, dtype=target.dtype)
    paged, other = tmp_path / "paged.py", tmp_path / "other.py"
    paged.write_text(recipe.apply([recipe.RecipeStep(PAGED)]))
    other.write_text(SEED + "\n# mine\n")
    config = small_config(small_target, tmp_path, library_dir=tmp_path / "lib", seed_from=(paged, other))
    programs, _ = initial_population(config, Program)
    by_file = {p.operator_args.get("from"): p for p in programs if p.operator == "seed_from"}
    assert made_here(by_file[str(paged)], {}.get) and not made_here(by_file[str(other)], {}.get)
    first = {"operator": "seed_from", "operator_args": json.dumps(by_file[str(paged)].operator_args)}
    assert first_lines(first, by_file[str(paged)].id) == ["# from the library: paged.txt", PAGED]


def test_the_hand_kept_recipe_is_taken_wherever_it_ranks(small_target, tmp_path):
    """A bf16 run on the toy shape ranks the bf16 recipes first; past --library-top the
    others are declined, but never fastest.txt: the best program known must be judged."""
    shape = json.loads((REPO / "target" / "model_config.json").read_text())
    config_path = tmp_path / "bf16.json"
    config_path.write_text(json.dumps({**shape, "torch_dtype": "bfloat16"}))
    config = RunConfig.build("cuda", model_config=config_path, weight_dir=small_target[1], workers=1,
                             history=tmp_path / "history.csv", runs_dir=tmp_path / "runs", library_top=1)
    taken, declined = library.seed_programs(config, SEED)
    assert [args["recipe"] for _, args in taken] == [str(library.SHIPPED / name) for name in
                                                     ("h100_20261126_729bb0cd.txt", "fastest.txt")]
    reasons = dict(declined)
    assert "fastest.txt" not in reasons
    assert len(reasons) == len(library.read_all([library.SHIPPED])) - 2
    assert all("(--library-top)" in why or why.startswith("makes the same program") for why in reasons.values())


def test_from_seed_only_turns_the_library_off():
    args = build_parser().parse_args(["run", "--from-seed-only", "--library", "lib", "--library-top", "2"])
    settings = given_settings(args)
    assert settings["library"] is False and str(settings["library_dir"]) == "lib" and settings["library_top"] == 2


def add_row(hist, source, parents, operator, args, tmp_path):
    path = tmp_path / f"{source_hash(source)}.py"
    path.write_text(source)
    hist.append({"run_id": "r1", "generation": 0, "candidate_id": source_hash(source), "operator": operator,
                 "parent_ids": [source_hash(p) for p in parents], "operator_args": args, "status": "ok",
                 "fitness": 1.0, "source_path": str(path), "target": "t"})


def test_a_winner_grown_from_a_library_program_joins_the_library_and_leads_the_next_run(small_target, tmp_path):
    config = small_config(small_target, tmp_path)
    from_library = recipe.apply([recipe.RecipeStep(PAGED)])
    winner = recipe.apply([recipe.RecipeStep("allele.load_weights.fused_qkv")], from_library)
    hist = history.History(config.history)
    add_row(hist, SEED, (), "seed", {}, tmp_path)
    add_row(hist, from_library, (), library.LIBRARY, {"recipe": "x/paged.txt", "steps": [PAGED]}, tmp_path)
    add_row(hist, winner, (from_library,), "allele.load_weights.fused_qkv", {}, tmp_path)
    text = lineage_recipe(history.read(config.history), source_hash(winner), config.history)
    assert recipe.apply(recipe.parse(text)) == winner
    target = library.RunTarget.of(config)
    table = [("prefill_4x32", 1234.4, 1000.0), ("decode_8x8x8", 99.6, 90.0)]
    judged = library.judged_as(target, "cpu (2 cores)", table, 1.21, "r1", source_hash(winner))
    path = library.add_winner(config.library_dir, text, judged)
    assert library.read(path).judged == {**judged, "date": library.read(path).judged["date"],
                                         "tokens_per_s": {"prefill_4x32": 1234, "decode_8x8x8": 100}}
    assert library.add_winner(config.library_dir, text, judged) is None  # the same steps: kept once
    taken, _ = library.seed_programs(config, SEED)
    assert [source for source, _ in taken] == [winner]
    assert json.loads(json.dumps(taken[0][1]))["recipe"] == str(path)


def test_a_lineage_from_the_library_names_its_recipe_in_a_word():
    step = {"operator": library.LIBRARY, "parent_ids": [], "candidate_id": "c",
            "operator_args": json.dumps({"recipe": "mutations/recipes/fastest.txt", "steps": [PAGED] * 9})}
    assert describe_step(step) == "library(fastest.txt)"


def test_a_run_on_long_prompts_also_takes_the_best_program_fitted_to_its_calls(small_target, tmp_path):
    """The best library program once more, its captured prefill raised to hold the 8,192-token
    prefills the long cases time; its steps replay to it. The public cases fit the recipes'
    graphs already: no such program."""
    config_path, weight_dir = small_target
    def cuda_config(bench, screen_bench):  # built, not run: no GPU needed
        return RunConfig.build("cuda", model_config=config_path, weight_dir=weight_dir, workers=1, bench=bench,
                               screen_bench=screen_bench, history=tmp_path / "history.csv", runs_dir=tmp_path / "runs",
                               library_top=1)
    public = cuda_config("public", "public")
    taken, _ = library.seed_programs(public, SEED)
    assert len(taken) == 1 and library.fitted_program(taken[0], public) is None
    taken, _ = library.seed_programs(cuda_config("public", "long"), SEED)
    assert len(taken) == 2
    source, args = taken[-1]
    assert args["steps"][-1] == 'tune_constant {"constant": "MAX_PREFILL_TOKENS", "new": 8192}'
    assert args["steps"][:-1] == taken[0][1]["steps"] and args["recipe"] == taken[0][1]["recipe"]
    assert "\nMAX_PREFILL_TOKENS = 8192  #" in source and "\nMAX_GRAPH_BATCH = 64  #" in source
    assert recipe.apply(recipe.parse("\n".join(args["steps"]))) == source


def test_a_replay_is_kept_on_disk_keyed_by_its_steps_source_and_code(tmp_path, monkeypatch):
    """The library's programs are replayed once a machine (mutations.replay_cache): a GPU
    host spent ~27 s of each run's start on them. The key is the steps, the source and the
    replaying code; a recipe that declines is not kept."""
    from mutations import replay_cache
    monkeypatch.setenv("EVOLVE_REPLAY_CACHE", str(tmp_path / "replays"))
    steps = [recipe.RecipeStep(PAGED)]
    made = replay_cache.apply(steps, SEED)
    assert made == recipe.apply(steps, SEED) and len(list((tmp_path / "replays").iterdir())) == 1
    replays = []
    monkeypatch.setattr(recipe, "apply", lambda *args: replays.append(args) or "replayed\n")
    assert replay_cache.apply(steps, SEED) == made and not replays  # read back
    assert replay_cache.apply(steps, SEED + "\n# other\n") == "replayed\n"  # another source
    monkeypatch.setattr(replay_cache, "code_key", lambda: "other code")
    assert replay_cache.apply(steps, SEED) == "replayed\n" and len(replays) == 2  # other code
    monkeypatch.setenv("EVOLVE_REPLAY_CACHE", "")
    assert replay_cache.folder() is None and replay_cache.apply(steps, SEED) == "replayed\n"
    monkeypatch.undo()
    monkeypatch.setenv("EVOLVE_REPLAY_CACHE", str(tmp_path / "replays"))
    declines = [recipe.RecipeStep("tune_constant", {"constant": "NO_SUCH_CONSTANT", "new": 3})]
    with pytest.raises(recipe.RecipeError, match="line"):
        replay_cache.apply(declines, SEED)
    assert len(list((tmp_path / "replays").iterdir())) == 3  # paged twice (two sources), other code; no decline
