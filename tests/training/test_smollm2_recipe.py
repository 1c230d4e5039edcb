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

from grpo_jax import config_lib, data, models, run_files
from grpo_jax.data import prompts
from grpo_jax.training import rl, task as task_lib
from tests.training.training_setups import REPO

CALCULATOR_PROMPT = config_lib.load_module(REPO / "configs" / "smollm2.py").CALCULATOR_PROMPT
INSTRUCTION = prompts.task_format("arithmetic").answer.instruction
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
    config = config_lib.load_config(
        f"{REPO / 'configs' / 'smollm2.py'}:path={chat_checkpoint},steps=1"
    )
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
    metrics = run_files.read_metrics(workdir)[0]
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


def test_smollm2_cpu_compare_table_reads_kept_runs(tmp_path, monkeypatch):
    """experiments/smollm2_cpu.py's --compare: steps = metric rows, s/step = the median gap
    between consecutive steps' times, accuracies from the kept answers (hand values)."""
    import gzip

    script = _experiment_script("smollm2_cpu", monkeypatch)
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
    with gzip.open(run / run_files.METRICS_GZ, "wt") as f:
        for step, t in enumerate((100.0, 160.0, 200.0, 250.0), 1):   # gaps 60, 40, 50: median 50
            f.write(json.dumps({"step": step, "time": t}) + "\n")
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


def _experiment_script(name, monkeypatch):
    import importlib.util
    monkeypatch.syspath_prepend(str(REPO / "experiments"))   # it imports smollm2_cpu
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_smollm2_controls_grade_first_lines_and_pair_rl_with_sft(monkeypatch):
    """experiments/smollm2_controls.py: the first non-empty line graded alone, the SFT
    control's update size and optimizer taken from the recipe, and the table's means and
    paired differences (hand values)."""
    script = _experiment_script("smollm2_controls", monkeypatch)
    assert script.first_line("\n 1. 98 + 99 = 197.\n2. 197 + 1 = 198") == " 1. 98 + 99 = 197."
    golds = [{"task": "arithmetic", "question": "98+99", "answer": "197"},
             {"task": "arithmetic", "question": "1+2", "answer": "3"}]
    rows = {"completion": ["1. 98 + 99 = 197.\n2. 197 + 1 = 198", "1 + 2 = 4\n#### 3"]}
    # first lines: "... = 197." right; "1 + 2 = 4" wrong (the whole answer would be right)
    assert script.graded(rows, golds)["first_line"] == [True, False]

    config = config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path=/unused")
    control = script.sft_control_config(config)
    assert control.sft.batch_size == 8 * 8 // 2   # the RL run's answers per update
    assert control.sft.optimizer.to_dict() == config.optimizer.to_dict()
    assert control.sft.steps == 10**9 and config.sft.steps != 10**9   # a new config

    summary = lambda accuracy, length: {
        "accuracy": accuracy, "first_line": accuracy, "strict_accuracy": 0.0, "format": 1.0,
        "mean_length": length, "truncated": 0.0}
    per_seed = {0: {"rl": (summary(0.5, 10.0), 8), "sft": (summary(0.6, 5.0), 28)},
                1: {"rl": (summary(0.2, 12.0), 9), "sft": (summary(0.6, 5.0), 30)}}
    args = type("Args", (), {"minutes": 20.0, "seeds": "0,1", "prompts": 500,
                             "recipe": "strict=True"})()
    machine = {"commit": "abc1234", "machine": "a CPU", "load": 0.0}
    table = script.format_table(args, machine, [("base", summary(0.1, 50.0))], per_seed)
    lines = table.splitlines()
    assert next(l for l in lines if l.startswith("DAPO (RL), mean of 2")).split()[-7:] == [
        "8", "0.350", "0.350", "0.000", "1.000", "11.0", "0.000"]   # steps round(8.5) = 8
    assert next(l for l in lines if l.startswith("SFT control, mean of 2")).split()[-7] == "29"
    accuracy = next(l for l in lines if l.startswith("#   accuracy"))
    # RL - SFT: -0.1 and -0.4, mean -0.25; 2 seeds: their range, and the exact sign-flip p
    # of 2 differences of one sign is 2/4 (no difference detected)
    assert accuracy.split()[2:5] == ["-0.100", "-0.400", "mean"]
    assert accuracy.endswith("mean -0.250, range [-0.400, -0.100] over 2 seeds, p 0.500: "
                             "no difference detected at 2 seeds")
    assert lines[-1].endswith("binomial standard error of 0.022")
    assert lines[0].endswith("--prompts 500 --recipe strict=True")
    assert "configs/smollm2.py:strict=True (DAPO," in lines[2]
    strict = next(l for l in lines if l.startswith("#   strict_accuracy"))
    assert strict.split()[2:5] == ["+0.000", "+0.000", "mean"]


def default_recipe():
    return config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path=/unused")


def test_smollm2_strict_pays_only_strict_accuracy_under_the_one_shot_prompt():
    """``strict=True``: the reward is the exact integer after the last ``####`` and the
    overlong penalty; gsm8k and the format are logged at weight 0; the one-shot turn."""
    config = config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path=/unused,strict=True")
    assert config.reward.correct == "integer_answer"
    paid = {spec[0]: spec[1] for spec in config.reward.specs}
    assert paid == {"integer_answer": 1.0, "gsm8k": 0.0, "integer_format": 0.0, "overlong": 1.0}
    assert config.task.shots == (("12+30", "12+30=42\n#### 42"),)
    # "#### 4" for 1+2: the default recipe pays the format 0.25, strict pays nothing;
    # "#### 3" earns 1 in both (plus the default's format bonus).
    examples = [{"task": "arithmetic", "question": "1+2", "answer": "3"}] * 2
    answers = ["1+2=4\n#### 4", "1+2=3\n#### 3"]
    for recipe, paid in ((config, [0.0, 1.0]), (default_recipe(), [0.25, 1.25])):
        scorer = task_lib.Scorer(recipe.reward, separate=False, max_new_tokens=96)
        try:
            values, correct, _ = scorer(["1+2"] * 2, answers, examples, [5, 5])
        finally:
            scorer.close()
        assert values.tolist() == paid and correct.tolist() == [False, True]
    with pytest.raises(ValueError, match="strict=True and tool=True"):
        config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path=/unused,strict=True,"
                               "tool=True")


def bigram_checkpoint(path, tokenizer, successor):
    """A one-layer model whose next token is ``successor[current token]`` (greedy, and at
    temperature 1 with probability > 0.99): attention and MLP write nothing (zero output
    projections), so the last position's state is its token's one-hot embedding, and the
    untied head maps it to its successor's logit sqrt(d) (the final RMSNorm's scale)."""
    import jax.numpy as jnp
    import numpy as np

    vocab = len(tokenizer)
    cfg = dataclasses.replace(models.get_model_config("tiny"), vocab_size=vocab, n_layers=1,
                              tie_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    assert cfg.d_model >= vocab
    model = models.init_model(cfg, seed=0)
    head = np.zeros((cfg.d_model, vocab), np.float32)
    for token, after in successor.items():
        head[token, after] = 1.0
    model.embed.set_value(jnp.eye(vocab, cfg.d_model))
    model.lm_head.set_value(jnp.asarray(head))
    model.layers[0].attn.o.set_value(jnp.zeros_like(model.layers[0].attn.o.get_value()))
    model.layers[0].mlp.down.set_value(jnp.zeros_like(model.layers[0].mlp.down.get_value()))
    models.save_pretrained(model, path, tokenizer=tokenizer)
    return path


@pytest.mark.slow
def test_smollm2_tool_episode_is_the_chat_template_with_tool_turns_out_of_the_loss(tmp_path):
    """``tool=True`` through the trainer's own draw (`rollout.draw`), on a ChatML tokenizer
    whose markers are special tokens (SmolLM2's template) and a model scripted to call
    ``<calculator>7*8</calculator>`` whenever a turn opens: the prompt is the template over
    the system prompt and the question, each call is answered by a ``tool`` turn in the
    template's form (its markers single special ids), the third call ends the episode
    (max_calls=2), the row is exactly the template's rendering of that conversation, and
    the loss mask is 0 on every token of the tool turns, 1 on the model's."""
    import jax
    import numpy as np

    from grpo_jax import sampling
    from grpo_jax.training import evaluation, rollout, task as task_lib
    from tests.environments.test_chat import chat_tokenizer

    tokenizer = chat_tokenizer()
    tokenizer.add_tokens(["<calculator>", "</calculator>"])   # one id each: a bigram chain
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)
    call = ids("<calculator>7*8</calculator>")
    chain = [ids("\n")[0], *call]
    path = bigram_checkpoint(str(tmp_path / "bigram"), tokenizer, dict(zip(chain, chain[1:])))
    config = config_lib.load_config(f"{REPO / 'configs' / 'smollm2.py'}:path={path},tool=True")
    config = config_lib.apply_overrides(config, {
        "task.data_dir": str(tmp_path / "data"), "task.knobs.num_train": 8,
        "task.knobs.num_test": 4, "objective.group_size": 4, "eval.num_prompts": 2})
    mesh, policy, source = evaluation.load_for_evaluation(config, path)
    examples = [data.decode_example(source[i]) for i in range(2)]
    episodic = rollout.Episodic.of(config, policy.tokenizer)
    scorer = task_lib.Scorer(config.reward, separate=False, max_new_tokens=128)
    try:
        rows, metrics = rollout.draw(policy, mesh, examples, config=config, scorer=scorer,
                                     rng=jax.random.key(0), method=sampling.Greedy(),
                                     episodic=episodic)
    finally:
        scorer.close()
        episodic.close()
    rows = {k: np.asarray(v) for k, v in rows.items()}

    end, start = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")
    reply = [end, *ids("\n"), start, *ids("tool\n56"), end, *ids("\n"), start, *ids("assistant\n")]
    assert (
        tokenizer.decode(reply)
        == "<|im_end|>\n<|im_start|>tool\n56<|im_end|>\n<|im_start|>assistant\n"
    )
    for row in range(8):
        example = examples[row // 4]
        question = example["question"]
        prompt = rows["prompt_tokens"][row][rows["prompt_mask"][row] > 0].tolist()
        assert prompt == [start, *ids(f"system\n{CALCULATOR_PROMPT}"), end, *ids("\n"), start,
                          *ids(f"user\n{question}\n\n{INSTRUCTION}"), end, *ids("\n"), start,
                          *ids("assistant\n")]
        n = int(rows["lengths"][row])
        tokens, mask = rows["tokens"][row][:n].tolist(), rows["mask"][row][:n].tolist()
        assert tokens == call + reply + call + reply + call
        model, tool = [1] * len(call), [0] * len(reply)
        assert mask == model + tool + model + tool + model
        assert rows["context_mask"][row][:n].tolist() == [1] * n
        assert not rows["truncated"][row]   # ended by the environment, not the budget
        turn = "<calculator>7*8</calculator>"
        messages = [{"role": "system", "content": CALCULATOR_PROMPT},
                    {"role": "user", "content": prompts.user_message(example)},
                    {"role": "assistant", "content": turn}, {"role": "tool", "content": "56"},
                    {"role": "assistant", "content": turn}, {"role": "tool", "content": "56"}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        assert tokenizer.decode(prompt + tokens) == rendered + turn
    assert metrics["tool_calls_per_episode"] == 3.0 and metrics["tool_use_rate"] == 1.0
    assert metrics["environment_tokens_per_episode"] == 2 * len(reply)
    assert metrics["tool_errors_per_episode"] == 1.0   # the call past max_calls
