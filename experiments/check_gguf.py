"""A real GGUF through convert_gguf, checked against transformers loading the same file.

    python experiments/check_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf --out_dir /ckpt/smollm2_hf

1. Converts the file with `grpo_jax.models.convert_gguf` into --out_dir (float32, every
   dequantised value kept) and into a temporary directory with --dtype bfloat16.
2. Logits: `models.from_pretrained(out_dir)` against transformers' PyTorch model loaded
   from the GGUF itself (`from_pretrained(dir, gguf_file=...)`, which dequantises with the
   same `gguf` package and un-permutes q/k on its own), float32, one unpadded prompt at a
   time: max |ours - theirs| / max |theirs| over all positions, and the fraction of
   positions whose argmax agrees. The bfloat16 row loads the bfloat16 conversion with
   float32 compute: the error that storing the weights in bfloat16 adds.
3. Tokenizer: ids of the converted tokenizer.json (`AutoTokenizer(out_dir)`) against
   transformers' GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`).
4. The greedy chat answer to QUESTION through the chat template with
   `sampling.sample_texts`, against transformers' greedy `generate` on the GGUF model,
   both for --new_tokens tokens.

Needs torch, gguf and accelerate (transformers' GGUF loader); the conversion itself does not.
"""

import argparse
import importlib.metadata
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

import gguf
import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from grpo_jax import models, sampling  # noqa: E402  (runs from a checkout, uninstalled)
from grpo_jax.models import convert_gguf  # noqa: E402

QUESTION = "What is 17 + 25? Answer with the number."
LOGIT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Solve step by step: a train travels 120 km in 1.5 hours. What is its average speed?",
]
TOKENIZER_STRINGS = [
    QUESTION,
    "Hello world! 12345 6789",
    "Hello world!  12345",        # two spaces before digits
    "x=1234567890;y=3.14159",
    "naïve café — 東京 🙂\n\n\tTabs",
    "don't I'll WE'VE",
    "  leading spaces and trailing   ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "def f(x):\n    return x ** 2  # square\n",
]


def header(argv):
    cpu = re.search(r"model name\s*:\s*(.*)", pathlib.Path("/proc/cpuinfo").read_text())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "grpo_jax"],
                           capture_output=True, text=True).stdout.strip()
    import torch
    import transformers

    print(f"# check_gguf  commit {commit or '?'}{' (grpo_jax/ modified)' if dirty else ''}  "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# CPU {cpu.group(1) if cpu else platform.processor()}, {os.cpu_count()} cores; python "
          f"{platform.python_version()}, jax {jax.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, gguf {importlib.metadata.version('gguf')}")
    print(f"# command: python experiments/check_gguf.py {' '.join(argv)}\n")


def table(title, columns, rows):
    print(title)
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows)]
    for cells in [columns, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths))
            )
        )
    print()


def chat(tokenizer, text):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


def logit_errors(model, torch_model, token_lists):
    """(max relative error over all prompts, fraction of positions whose argmax agrees)."""
    import torch

    errors, agree, total = [], 0, 0
    for ids in token_lists:
        tokens = np.array([ids], np.int32)
        ours = np.asarray(model(tokens))
        with torch.no_grad():
            theirs = torch_model(torch.tensor(tokens).long()).logits.numpy()
        errors.append(float(np.abs(ours - theirs).max() / np.abs(theirs).max()))
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        total += tokens.size
    return max(errors), agree / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf_path")
    parser.add_argument(
        "--out_dir", default=None, help="where to write the conversion (default: a temporary dir)"
    )
    parser.add_argument("--new_tokens", type=int, default=32)
    args = parser.parse_args(argv)
    header(sys.argv[1:] if argv is None else argv)
    import torch
    import transformers

    torch.set_num_threads(1)
    gguf_dir, gguf_file = os.path.split(os.path.abspath(args.gguf_path))
    tmp = tempfile.mkdtemp()
    out_dir = args.out_dir or os.path.join(tmp, "float32")
    start = time.perf_counter()
    cfg = convert_gguf.convert(args.gguf_path, out_dir)
    seconds = time.perf_counter() - start
    convert_gguf.convert(args.gguf_path, os.path.join(tmp, "bfloat16"), dtype="bfloat16")
    print(f"converted {gguf_file} -> {out_dir} in {seconds:.1f} s: {cfg.model_type}, "
          f"{cfg.n_layers} layers, d {cfg.d_model}, {cfg.n_heads} query / {cfg.n_kv_heads} kv "
          f"heads, vocab {cfg.vocab_size}, tied embeddings {cfg.tie_embeddings}\n")

    model, tokenizer = models.from_pretrained(out_dir)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file,
                                                                    dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in torch_model.parameters())
    print(f"transformers' GGUF model: {type(torch_model).__name__}, "
          f"{n_params / 1e6:.1f}M parameters\n")

    prompts = LOGIT_PROMPTS + [chat(tokenizer, QUESTION)]
    token_lists = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rows = []
    for name, path in [
        ("float32 (default)", out_dir), ("bfloat16 storage", os.path.join(tmp, "bfloat16")),
    ]:
        ours, _ = models.from_pretrained(path, param_dtype="float32")
        error, agree = logit_errors(jax.jit(lambda t, m=ours: m(t)), torch_model, token_lists)
        rows.append(
            [name, len(prompts), sum(map(len, token_lists)), f"{error:.2e}", f"{agree:.4f}"]
        )
    table("1. logits vs transformers loading the same GGUF (float32 compute)",
          ["converted weights", "prompts", "positions", "max rel error", "argmax agree"], rows)

    strings = {repr(t)[:44]: t for t in TOKENIZER_STRINGS}
    strings.update(
        {f"chat template: {t[:29]!r}": chat(tokenizer, t) for t in (QUESTION, TOKENIZER_STRINGS[4])}
    )
    rows = []
    for label, text in strings.items():
        ours_ids, their_ids = tokenizer(text)["input_ids"], theirs_tok(text)["input_ids"]
        first = next(
            (i for i, (a, b) in enumerate(zip(ours_ids, their_ids)) if a != b),
            None if len(ours_ids) == len(their_ids) else min(len(ours_ids), len(their_ids)),
        )
        diff = (
            ""
            if first is None
            else f"ours {tokenizer.convert_ids_to_tokens(ours_ids[first : first + 3])} vs "
            f"theirs {theirs_tok.convert_ids_to_tokens(their_ids[first : first + 3])}"
        )
        rows.append([label, len(ours_ids), len(their_ids), "yes" if first is None else "no", diff])
    table("2. tokenizer ids: converted tokenizer.json vs transformers' GGUF tokenizer",
          ["string", "ours", "theirs", "equal", "first difference"], rows)
    print(f"chat template identical: {tokenizer.chat_template == theirs_tok.chat_template}")
    pre = convert_gguf.read_metadata(gguf.GGUFReader(args.gguf_path)).get("tokenizer.ggml.pre")
    print(f"pre-tokenizer: {pre!r}. "
          "For 'smollm' llama.cpp splits off every digit before GPT-2's regex (as SmolLM's "
          "tokenizer.json\n"
          "does with a Digits pre-tokenizer); transformers' GGUF tokenizer applies GPT-2's regex "
          "alone, so\n"
          "spaces before a digit group differently there.\n")

    ((ours_answer,),) = sampling.sample_texts(
        model, tokenizer, [QUESTION], chat=True, max_new_tokens=args.new_tokens
    )
    ids = torch.tensor(
        [theirs_tok(chat(theirs_tok, QUESTION), add_special_tokens=False)["input_ids"]]
    )
    with torch.no_grad():
        out = torch_model.generate(
            ids, max_new_tokens=args.new_tokens, do_sample=False,
            eos_token_id=theirs_tok.eos_token_id, pad_token_id=theirs_tok.pad_token_id,
        )
    their_answer = theirs_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    table(f"3. greedy chat answer to {QUESTION!r}, {args.new_tokens} new tokens at most",
          ["sampler", "answer"], [["grpo_jax sampling.sample_texts", repr(ours_answer)],
                                  ["transformers generate (GGUF)", repr(their_answer)]])
    print(f"identical: {ours_answer == their_answer}")


if __name__ == "__main__":
    main()
