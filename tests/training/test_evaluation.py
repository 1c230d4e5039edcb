"""Held-out evaluation: each process's share of the prompts, and the "eval" mode."""

import json

import pytest

from grpo_jax import config_lib
from grpo_jax.training import evaluation, policy as policy_lib, rl
from tests import readme_metrics
from tests.training.training_setups import tiny_config


def test_held_out_shares_are_equal_sized_and_cover_every_example():
    source = [{"task": "t", "question": str(i), "answer": str(i), "solution": ""} for i in range(7)]
    examples, real = evaluation.own_examples(source, 5)   # one process: all of it
    assert real == 5 and [e["question"] for e in examples] == ["0", "1", "2", "3", "4"]
    examples, real = evaluation.own_examples(source, 7)   # the whole split
    assert real == 7 and [e["question"] for e in examples] == [str(i) for i in range(7)]


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_an_example_draws_from_the_same_stream_on_any_number_of_processes(monkeypatch, processes):
    """The sampled evaluation's prompt ids (faked process layouts): every process's real
    rows get their examples' places in the split, so each example samples alike on 1, 2
    or 3 processes; a later chunk's rows continue from where the chunk starts."""
    source = [{"task": "t", "question": str(i), "answer": str(i), "solution": ""} for i in range(7)]
    monkeypatch.setattr(evaluation.jax, "process_count", lambda: processes)
    for process in range(processes):
        monkeypatch.setattr(evaluation.jax, "process_index", lambda: process)
        examples, real = evaluation.own_examples(source, 5)
        width = len(examples) + 1   # padded for the mesh
        ids = evaluation.prompt_ids(5, len(examples), 0, width, processes)
        assert ids.shape == (processes * width,)
        assert ids[process * width:process * width + real].tolist() == \
            [int(e["question"]) for e in examples[:real]]
    assert evaluation.prompt_ids(5, 3, 0, 4, 2).tolist() == [0, 1, 2, 3, 3, 4, 5, 6]
    assert evaluation.prompt_ids(600, 300, 256, 48, 2)[[0, 47, 48, 95]].tolist() == \
        [256, 303, 556, 603]


def test_more_prompts_than_the_held_out_split_has_is_refused():
    source = [{"task": "t", "question": str(i), "answer": str(i), "solution": ""} for i in range(7)]
    message = (r"eval.num_prompts=8 is more than the 7 examples of the held-out split "
               r"\(task.eval_split\): lower eval.num_prompts to 7 or less, or evaluate on a "
               r"bigger split \(for a generated task, a larger task.knobs.num_test\)")
    with pytest.raises(ValueError, match=message):
        evaluation.own_examples(source, 8)
    with pytest.raises(ValueError, match=message):
        evaluation.check_num_prompts(8, source)
    evaluation.check_num_prompts(7, source)


@pytest.mark.parametrize("warm_start", [True, False], ids=["sft_warm_start", "rl_only"])
def test_a_run_asking_for_more_prompts_than_its_split_has_fails_before_building_a_model(
        data_dir, tmp_path, monkeypatch, warm_start):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the prompt count was checked")

    monkeypatch.setattr(policy_lib, "start_policy", no_model)
    config = tiny_config("dapo", data_dir, **{"eval.num_prompts": 17,   # 16 test examples
                                              "model.sft_warm_start": warm_start})
    with pytest.raises(ValueError, match=r"eval.num_prompts=17 is more than the 16 examples"):
        rl.train(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_eval_mode_scores_a_checkpoint_and_records_its_config(data_dir, tmp_path):
    config = tiny_config("dapo", data_dir, **{"train.export": True, "eval.num_prompts": 8})
    rl.train(config, str(tmp_path / "run"))
    config.model.path, config.model.name = str(tmp_path / "run" / "export"), ""
    metrics = evaluation.evaluate_to_file(config, str(tmp_path / "eval"))
    with open(tmp_path / "eval" / "eval.json") as f:
        assert json.load(f) == metrics
    assert set(metrics) == {"eval_accuracy", "eval_mean_at_k", "eval_pass_at_k", "eval_k"}
    assert readme_metrics.undocumented(metrics) == []
    with open(tmp_path / "eval" / "config.json") as f:
        assert json.load(f) == json.loads(config_lib.to_json(config_lib.frozen(config)))
    # The same draws as an evaluation at step 0 of the saved policy, whoever asks.
    assert evaluation.evaluate_export(config, config.model.path) == metrics
    config.model.path = ""
    with pytest.raises(ValueError, match="mode 'eval' needs --config.model.path"):
        evaluation.evaluate_to_file(config, str(tmp_path / "eval2"))
