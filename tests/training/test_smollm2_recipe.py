"""configs/smollm2.py through the loading path of a real checkpoint, on a stand-in.

The recipe's model (SmolLM2-135M-Instruct, converted from its GGUF) is not in the test
environment; a tiny random model saved as a Hugging Face directory with a character
tokenizer and its own chat template takes its place, so the run goes through
`from_pretrained`, the tokenizer's chat template and the recipe's rewards as a user's does.
"""

import dataclasses
import json
import re

import pytest
import tokenizers
import transformers

from grpo_jax import config_lib, models
from grpo_jax.data import prompts
from grpo_jax.training import rl
from tests.training.training_setups import REPO

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny random qwen3 with a character tokenizer over printable ASCII (id 1 = <eos>)
    and a chat template that marks each turn's role."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("[\\s\\S]"),
                                                          behavior="isolated")
    model.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    cfg = dataclasses.replace(models.get_model_config("tiny"), vocab_size=len(vocab),
                              eos_token_id=1)
    path = str(tmp_path_factory.mktemp("chat_ckpt"))
    models.save_pretrained(models.init_model(cfg, seed=0), path, tokenizer=tokenizer)
    return path


@pytest.mark.slow
def test_smollm2_recipe_runs_in_chat_with_its_rewards(chat_checkpoint, tmp_path):
    """One step of the recipe (its objective, rewards and chat prompts; fewer rows and
    tokens): every prompt is the template over the question and the answer instruction,
    the questions are 2-digit additions, and both rewards are reported."""
    config = config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path={chat_checkpoint},steps=1")
    config = config_lib.apply_overrides(config, {
        "task.data_dir": str(tmp_path / "data"), "task.knobs.num_train": 64,
        "task.knobs.num_test": 8, "rollout.prompts_per_batch": 4, "objective.group_size": 4,
        "rollout.max_new_tokens": 8, "filtering.dynamic_sampling": False,
        "train.micro_batches": 1, "train.log_rollouts_every": 1, "train.export": False,
        "eval.num_prompts": 4})
    workdir = tmp_path / "run"
    assert rl.train(config, str(workdir)) == 1

    with open(workdir / "rollouts" / "1.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 16
    instruction = prompts.task_format("arithmetic").answer.instruction
    for row in rows:
        match = re.fullmatch(r"<user>(\d{1,2})\+(\d{1,2})\n\n(.*)<assistant>", row["prompt"], re.S)
        assert match, row["prompt"]
        assert match.group(3) == instruction
    with open(workdir / "metrics.jsonl") as f:
        metrics = json.loads(f.readline())
    assert {"rewards/gsm8k", "rewards/integer_answer", "accuracy"} <= set(metrics)
    # accuracy counts the right number (gsm8k), the format reward only adds to it
    assert metrics["accuracy"] == pytest.approx(metrics["rewards/gsm8k"])


def test_smollm2_lora_variants_set_rank_learning_rate_and_quantized_base():
    """``lora=True`` trains rank-16 adapters at 10x the full run's 1e-5; ``quantize=int8``
    adds the integer base; ``quantize`` without ``lora`` names the missing argument."""
    recipe = REPO / "configs" / "smollm2.py"
    full = config_lib.load_config(f"{recipe}:path=/ckpt")
    lora = config_lib.load_config(f"{recipe}:path=/ckpt,lora=True")
    qlora = config_lib.load_config(f"{recipe}:path=/ckpt,lora=True,quantize=int8")
    assert (full.model.lora.rank, full.optimizer.learning_rate) == (0, 1e-5)
    assert (lora.model.lora.rank, lora.model.lora.quantize) == (16, "")
    assert lora.optimizer.learning_rate == pytest.approx(1e-4)
    assert (qlora.model.lora.rank, qlora.model.lora.quantize) == (16, "int8")
    with pytest.raises(ValueError, match="lora=True"):
        config_lib.load_config(f"{recipe}:path=/ckpt,quantize=int8")


def test_smollm2_cpu_compare_table_reads_kept_runs(tmp_path):
    """experiments/smollm2_cpu.py's --compare: steps = metric rows, s/step = the median gap
    between consecutive steps' times, accuracies from the kept answers (hand values)."""
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_cpu",
                                                  REPO / "experiments" / "smollm2_cpu.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    answers = lambda correct, completions: {
        "correct": correct, "strict": [0] * 4, "format": [0] * 4, "length": [10, 20, 30, 40],
        "truncated": [0] * 4, "completion": completions}
    base_completions = ["#### 197", "98 + 99", "#### 5", ""]
    after_completions = ["#### 197", "1 + 2 = 3", "#### 3 + 2", "#### 9"]
    run = tmp_path / "lora"
    run.mkdir()
    (run / "base_answers.json").write_text(json.dumps(answers([1, 0, 0, 0], base_completions)))
    (run / "after_answers.json").write_text(json.dumps(answers([1, 1, 1, 0], after_completions)))
    (run / "run.json").write_text(json.dumps({"commit": "abc1234", "peak_rss_bytes": 3 * 2**30,
                                               "checkpoint_bytes": 5 * 2**20}))
    with gzip.open(run / "metrics.jsonl.gz", "wt") as f:
        for t in (100.0, 160.0, 200.0, 250.0):   # gaps 60, 40, 50 -> median 50
            f.write(json.dumps({"time": t}) + "\n")
    table = script.compare_table([f"lora={run}"]).splitlines()
    row = next(line for line in table if line.startswith("lora ")).split()
    assert row == ["lora", "abc1234", "4", "50.0", "3.00", "GiB", "5", "MiB", "0.250",
                   "0.750", "0.000", "25.0"]
    assert table[-1] == "# lora: n/a, load n/a at the start, recipe arguments ''"
    # graded again against golds: "#### 3 + 2" (arithmetic left to do) no longer counts;
    # "1 + 2 = 3" is right by its last number, not strictly; "#### 9" is wrong
    golds = [{"task": "arithmetic", "question": q, "answer": a}
             for q, a in (("98+99", "197"), ("1+2", "3"), ("3+2", "5"), ("4+4", "8"))]
    table = script.compare_table([f"lora={run}"], golds).splitlines()
    row = next(line for line in table if line.startswith("lora ")).split()
    # base: "#### 197" and "#### 5" right (0.5); after: "#### 197" (strict too) and "1 + 2 = 3"
    assert row[8:] == ["0.500", "0.500", "0.250", "25.0"]
    with pytest.raises(ValueError, match="4 kept answers for 3"):
        script.compare_table([f"lora={run}"], golds[:3])
