"""Decoder-only language models in Flax NNX: Llama 3, Qwen2/2.5, Qwen3, Qwen3-MoE.

    model, tokenizer = from_pretrained("/ckpt/Qwen3-0.6B", mesh=mesh, rules="fsdp")
    logits = model(tokens, attention_mask=mask)            # [B, S, V] float32
    logp = model.token_logprobs(tokens, targets)            # [B, S], chunked over V
    save_pretrained(model, "/out/policy", tokenizer=tokenizer)
    critic = value_model_from(model, mesh=mesh)             # PPO's value model, V(s_t): [B, S]
"""

from grpo_jax import _extras

_extras.require("grpo_jax.models")   # before the imports it guards

from grpo_jax.models.config import ATTENTION_IMPLS
from grpo_jax.models.config import Llama3RopeScaling
from grpo_jax.models.config import MOE_IMPLS
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.config import REMAT_POLICIES
from grpo_jax.models.config import SUPPORTED_MODEL_TYPES
from grpo_jax.models.config import from_hf_config
from grpo_jax.models.config import run_overrides
from grpo_jax.models.config import to_hf_config
from grpo_jax.models.decoder import Decoder
from grpo_jax.models.decoder import KVCache
from grpo_jax.models.decoder import abstract_model
from grpo_jax.models.decoder import default_positions
from grpo_jax.models.decoder import init_model
from grpo_jax.models.hf import from_pretrained
from grpo_jax.models.hf import load_config
from grpo_jax.models.hf import load_tokenizer
from grpo_jax.models.hf import save_pretrained
from grpo_jax.models.logprobs import chunked_token_logprobs
from grpo_jax.models.lora import LoraSpec
from grpo_jax.models.lora import adapters_off
from grpo_jax.models.lora import merged_state
from grpo_jax.models.lora import peft_exportable
from grpo_jax.models.lora import quantize_base
from grpo_jax.models.lora import save_peft_adapter
from grpo_jax.models.named import NAMED_CONFIGS
from grpo_jax.models.named import get_model_config
from grpo_jax.models.sharding import RULE_SETS
from grpo_jax.models.sharding import logical_to_spec
from grpo_jax.models.sharding import state_shardings
from grpo_jax.models.support_logprobs import support_token_logprobs
from grpo_jax.models.value import ValueModel
from grpo_jax.models.value import abstract_value_model
from grpo_jax.models.value import load_value_model
from grpo_jax.models.value import save_value_model
from grpo_jax.models.value import value_model_from
