"""The rollout log (``train.log_rollouts_every``): each row's prompt as the model read it."""

import json

import numpy as np

from grpo_jax.training import rollout
from tests.environments.test_chat import chat_tokenizer


def test_a_chat_prompt_keeps_its_end_of_turn_markers(tmp_path):
    tokenizer = chat_tokenizer()   # <|im_end|> closes each turn and is the eos
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompt = np.array([[pad, pad] + ids])                  # left-padded, as the sampler's
    completion = tokenizer("5", add_special_tokens=False)["input_ids"] + [eos, pad]
    batch = {"prompt_tokens": prompt, "prompt_mask": (prompt != pad).astype(np.int32),
             "tokens": np.array([completion]), "rewards": np.array([[1.0]]),
             "correct": np.array([True]), "row_valid": np.array([True]),
             "lengths": np.array([2])}
    path = tmp_path / "rollouts" / "1.jsonl"
    rollout.write_samples(batch, tokenizer, str(path))
    row = json.loads(path.read_text())
    assert row == {"prompt": text, "completion": "5", "reward": [1.0], "correct": True,
                   "length": 2, "row_valid": True}
