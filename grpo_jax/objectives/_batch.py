"""The batch a composed objective reads: its keys, which setting reads each, and the checks.

docs/objectives.md has the table of keys (shape, meaning, which setting reads each);
`BATCH_KEYS` is the same table in code, and a test holds the two equal. A key no
objective reads raises, naming the closest known key: a misspelled key would otherwise
be ignored and change the loss silently (``behavior_logp`` for ``behaviour_logp`` makes
M2PO's mask fall back to ``old_logp``).
"""

import difflib

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.objectives import _checks

# key -> (its shape: B rows, T response tokens, K reward columns; what it holds).
BATCH_KEYS = {
    "old_logp": ("[B, T]", "log-probs under pi_old, the policy the ratio divides by"),
    "mask": ("[B, T]", "the response mask: 1 (or True) on the tokens the loss reads, 0 "
                       "elsewhere"),
    "advantages": ("[B] or [B, T]", "precomputed over the FULL batch "
                                    "(objective.advantages(batch)) before splitting"),
    "rewards": ("[B] or [B, K]", "to compute the advantages inside the call ([B, K] for "
                                 "gdpo: one column per reward); NaN or inf: unscorable"),
    "ref_logp": ("[B, T]", "log-probs under the reference policy (kl.beta > 0)"),
    "teacher_logp": ("[B, T]", "a teacher's log-probs of the sampled tokens "
                               "(advantage.estimator 'reverse_kl', distillation)"),
    "values": ("[B, T]", "the critic's V(s_t) (advantage.estimator 'gae')"),
    "correct": ("[B]", "which answers are right (positive_nll_weight > 0)"),
    "entropy": ("[B, T]", "token entropy, computed inside the differentiated function "
                          "(entropy_coef != 0, top_entropy_quantile < 1); a metric "
                          "whenever present"),
    "entropy_coef": ("[]", "this step's entropy coefficient, in place of entropy_coef "
                           "(adaptive control: entropy_bonus_coef); needs entropy"),
    "behaviour_logp": ("[B, T]", "the sampler's log-probs (importance.enabled; read by "
                                 "m2po and offpolicy_mask when present, else old_logp)"),
    "truncated": ("[B]", "which answers hit the length limit (overlong.mode 'mask')"),
    "loss_seed": ("[B] int", "per-row seeds of clip_cov's random draw (the key is the "
                             "first row's)"),
    "prompt_ids": ("[B]", "one id per row naming its prompt: checks the P x G layout"),
    "row_valid": ("[B] bool", "real rows (padding rows False): global_counts' num_seqs"),
    "num_tokens": ("[]", "GLOBAL count of loss_mask tokens (micro-batching, sharding)"),
    "num_seqs": ("[]", "GLOBAL count of real rows"),
    "num_positive_tokens": ("[]", "GLOBAL count of loss_mask tokens of correct answers "
                                  "(positive_nll_weight > 0)"),
}
# What grpo_jax's trainer carries in a micro-batch besides: its model's inputs (prompt and
# completion tokens, a multi-turn episode's context mask, an MoE's replayed routing or
# the experts its sampler chose, the kept sampling support), the packing plan, the critic's
# targets, the adapters' dropout key and the row lengths. An objective accepts these keys
# and reads none of them.
TRAINER_KEYS = frozenset({
    "prompt_tokens", "prompt_mask", "tokens", "lengths", "context_mask", "returns",
    "support_ids", "support_size", "prompt_routing", "routing", "sampled_prompt_routing",
    "sampled_routing", "dropout_key",
    "pack_back", "pack_fill", "pack_positions", "pack_rows_fraction", "pack_segments",
    "pack_src", "pack_target",
})


def check_keys(batch, extra_keys=(), *, need_mask=True):
    """Raises TypeError unless `batch` is a mapping, ValueError on a key no objective reads
    (naming the closest known key), KeyError without ``mask`` (when `need_mask`)."""
    if not hasattr(batch, "keys"):
        raise TypeError(f"an objective's batch is a dict of arrays (docs/objectives.md lists "
                        f"its keys); got {type(batch).__name__}")
    for key in batch:
        if key in BATCH_KEYS or key in TRAINER_KEYS or key in extra_keys:
            continue
        known = [*BATCH_KEYS, *TRAINER_KEYS, *extra_keys]
        match = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f"; did you mean {match[0]!r}?" if match else ""
        raise ValueError(
            f"batch[{key!r}] is not a key any objective reads{hint} (the keys this objective "
            "reads: grpo_jax.objectives.describe(objective); to carry a key of your own "
            "through, objective.accepting(key))")
    if need_mask and "mask" not in batch:
        raise KeyError(f"batch['mask'] is required: the [B, T] response mask (1 on the "
                       f"tokens the loss reads); the batch has {sorted(batch)}")


def as_arrays(batch):
    """The batch with Python lists and tuples made arrays (other values as they are)."""
    return {k: jnp.asarray(v) if isinstance(v, (list, tuple)) else v for k, v in batch.items()}


def _layout_ok(ids, group_size):
    """`[]` bool: each consecutive block of `group_size` rows shares one id and two
    neighbouring blocks differ (jnp: traceable)."""
    grouped = ids.reshape(-1, group_size)
    same = jnp.all(grouped == grouped[:, :1])
    distinct = jnp.all(grouped[1:, 0] != grouped[:-1, 0])
    return same & distinct


def _layout_error(ids, group_size):
    """The message naming the first group that breaks the layout, or None."""
    grouped = np.asarray(ids).reshape(-1, group_size)
    for p, row in enumerate(grouped):
        if np.any(row != row[0]):
            return (f"rows {p * group_size}..{(p + 1) * group_size - 1} (group {p}) hold the "
                    f"prompt_ids {row.tolist()}: a group's G rows must be consecutive and "
                    "share one prompt (interleaved rows, or group_size larger than the "
                    "batch's G?)")
        if p and row[0] == grouped[p - 1, 0]:
            return (f"groups {p - 1} and {p} (rows {(p - 1) * group_size}.."
                    f"{(p + 1) * group_size - 1}) share the prompt id {row[0]!r}: group_size "
                    "smaller than the batch's G? (give neighbouring groups distinct ids, "
                    "e.g. the prompt's index in the batch)")
    return None


def check_group_layout(prompt_ids, group_size, *, fn="objective"):
    """Checks that the rows are P prompts x `group_size` completions, laid out
    consecutively, from ``prompt_ids`` `[B]` (one id per row, naming its prompt).

    A concrete array is checked on the host: ValueError naming the first group that
    breaks the layout (its rows mixing prompts: interleaved rows, or a group_size larger
    than the batch's; two neighbouring groups with one prompt: a smaller one). A traced
    array (under jit), or one spread over other hosts, cannot raise: the result is then a
    `[]` bool that the caller turns into NaN advantages (loud: the loss is NaN). Returns
    True when concrete and valid.
    """
    _checks.check_rows(fn, "batch['prompt_ids']", prompt_ids)
    ids = jnp.asarray(prompt_ids) if isinstance(prompt_ids, (list, tuple)) else prompt_ids
    _checks.check_group_size(group_size, ids.shape[0], fn=fn)
    if isinstance(ids, jax.core.Tracer) or not getattr(ids, "is_fully_addressable", True):
        return _layout_ok(ids, group_size)   # not readable here: checked on device
    error = _layout_error(ids, group_size)
    if error is not None:
        raise ValueError(f"{fn}: batch['prompt_ids'] does not match group_size={group_size}: "
                         f"{error}")
    return True
