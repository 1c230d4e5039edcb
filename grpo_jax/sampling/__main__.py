"""Samples completions of text prompts from a local Hugging Face checkpoint and prints them.

    python -m grpo_jax.sampling --checkpoint /ckpt/Qwen3-0.6B --prompt "2+2=" --prompt "Hi" \
        --num_samples 4 --max_new_tokens 64 --temperature 0.7 --top_p 0.95 --seed 0

--temperature 0 decodes greedily. Runs on every device: on CPU the host is split into one
XLA device per core first (`parallel.use_cpu_cores`, as `python -m grpo_jax.main` does;
XLA_FLAGS=--xla_force_host_platform_device_count=N chooses N), and the rows are split over
a ("data", -1), ("tensor", 1) mesh. The same seed gives the same text on any device count.
"""

import sys

import jax
from absl import app, flags

from grpo_jax import models, parallel
from grpo_jax.sampling._methods import make_method
from grpo_jax.sampling._texts import sample_texts

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Hugging Face model directory (config.json, safetensors, tokenizer).",
    required=True,
)
_PROMPT = flags.DEFINE_multi_string(
    "prompt", None, "A prompt; repeat the flag for several.", required=True
)
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Completions per prompt (G).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 256, "The most tokens per completion.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k cut (0 = off).")
_MIN_P = flags.DEFINE_float("min_p", 0.0, "Min-p cut (0 = off).")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_CHAT = flags.DEFINE_bool("chat", False, "Wrap each prompt with the tokenizer's chat template.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype (float32, bfloat16).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; pass prompts with --prompt")
    parallel.use_cpu_cores()  # before JAX runs anything
    mesh = parallel.make_mesh([("data", -1), ("tensor", 1)])
    print(f"sampling on mesh {dict(mesh.shape)} over {mesh.size} "
          f"{jax.devices()[0].platform} device(s)", file=sys.stderr)
    model, tokenizer = models.from_pretrained(
        _CHECKPOINT.value, dtype=_DTYPE.value, mesh=mesh, rules="sampling"
    )
    if tokenizer is None:
        raise app.UsageError(
            f"{_CHECKPOINT.value} has no tokenizer files; save one with the checkpoint"
        )
    method = make_method(
        temperature=_TEMPERATURE.value, top_p=_TOP_P.value, top_k=_TOP_K.value, min_p=_MIN_P.value
    )
    with jax.set_mesh(mesh):
        texts = sample_texts(
            model, tokenizer, _PROMPT.value, num_samples=_NUM_SAMPLES.value,
            max_new_tokens=_MAX_NEW_TOKENS.value, method=method, seed=_SEED.value, chat=_CHAT.value,
        )
    for i, (prompt, samples) in enumerate(zip(_PROMPT.value, texts)):
        print(f"=== prompt {i}: {prompt!r}")
        for j, text in enumerate(samples):
            print(f"--- sample {j}\n{text}")


if __name__ == "__main__":
    app.run(main)
