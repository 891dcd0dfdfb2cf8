"""A program right on the contract's format but wrong on a derived config fails at stage
"derived", the verdict naming the config and, on "families", the feature it gets wrong."""
import json

import pytest

from fitness.judge import Judge
from tests.conftest import SEED_ENGINE
from fitness.adversaries.planted import edit
from tests.test_cli import fitness_cli, target_args


def reads_a_stored_head(src):
    # The contract's model always stores lm_head.weight: a tied head is a KeyError.
    return edit(src, 'is_tied = model_config.get("tie_word_embeddings") and "lm_head.weight" not in raw',
                "is_tied = False")


def ignores_qk_norms(src):
    return edit(src, '    if "q_norm" not in layer:\n', "    if True:\n")


def write(fault, directory):
    path = directory / f"{fault.__name__}.py"
    path.write_text(fault(SEED_ENGINE.read_text()))
    return path


def judged(paths, small_target, scratch, level):
    config_path, weight_dir = small_target
    judge = Judge("cpu", scratch=scratch, threads=1)
    try:
        return judge.judge_group(paths, config_path, weight_dir, seed=7, level=level, bench="none", timeout=240)
    finally:
        judge.close()


@pytest.fixture(scope="module")
def verdicts(small_target, scratch, tmp_path_factory):
    """Both faulty programs judged in full, in one group."""
    folder = tmp_path_factory.mktemp("derived_verdict")
    tied, no_norms = judged([write(reads_a_stored_head, folder), write(ignores_qk_norms, folder)],
                            small_target, scratch, "full")
    return {"tied": tied, "no_norms": no_norms}


def test_a_crash_on_the_tied_head_is_a_derived_crash_naming_it(verdicts):
    verdict = verdicts["tied"]
    assert (verdict["status"], verdict["stage"], verdict["case"]) == ("crash", "derived", "families"), verdict
    assert verdict["error"].startswith("derived/families: fails with the tied head (tie_word_embeddings): ")
    assert "lm_head.weight" in verdict["error"]  # the original error follows
    assert "q/k norms" not in verdict["error"] and "biases" not in verdict["error"]


def test_ignored_qk_norms_are_incorrect_at_derived_naming_them(verdicts):
    verdict = verdicts["no_norms"]
    assert (verdict["status"], verdict["stage"], verdict["case"]) == ("incorrect", "derived", "families"), verdict
    assert verdict["error"].startswith("derived/families: fails with the q/k norms (qk_norm): families/")
    assert "tolerance" in verdict["error"] and "tied head" not in verdict["error"]


def test_without_the_derived_configs_the_tied_head_crash_is_not_seen(small_target, scratch, tmp_path):
    (verdict,) = judged([write(reads_a_stored_head, tmp_path)], small_target, scratch, "screen")
    assert verdict["status"] == "ok", verdict


def test_check_names_the_config_and_the_feature(small_target, tmp_path):
    done = fitness_cli("check", "--engine", write(reads_a_stored_head, tmp_path), *target_args(small_target),
                       "--seed", 3, "--scratch", tmp_path)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["status"] == "failed" and report["case"] == "families", report
    assert report["errors"][0].startswith("derived/families: fails with the tied head (tie_word_embeddings): ")
    assert "KeyError: 'lm_head.weight'" in report["errors"][0]
