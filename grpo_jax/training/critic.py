"""PPO's critic in the trainer: a value model beside the policy, its values, targets, loss
and metrics.

The critic is the policy's decoder with a scalar head (`models.ValueModel`): its own
parameters and optimizer (``critic.optimizer``), sharded by the same rules
(``model.rules``), started from the policy's starting weights or from ``critic.path``,
checkpointed with the run and exported next to the policy. Each step it gives every
completion token its value V(s_t) on the rollout batch (`make_value_fn`); the policy's
advantages are GAE over those values (the objective's ``"gae"`` estimator), and the
critic regresses onto GAE returns with its own lambda (`value_targets`): VAPO's decoupled
GAE (Yue et al., arXiv:2504.05118, sec. 3.1) is ``critic.lam = 1`` beside a smaller or
length-adaptive policy lambda. It is trained on the same minibatches as the policy, with
PPO's clipped value loss (`objectives.value_loss`), averaged over the batch's tokens.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import transformers
from flax import nnx

from grpo_jax import models, objectives, parallel
from grpo_jax.training import batch as batch_lib
from grpo_jax.training import policy as policy_lib

POSITION_BUCKETS = 4   # advantage statistics per quarter of the completion budget


@dataclasses.dataclass
class Critic:
    """The value model being trained.

    Attributes:
      graphdef: the `models.ValueModel`'s `nnx.GraphDef`; params: its `nnx.State`,
        sharded on the run's mesh; opt_state: its optimizer state (None until created).
    """

    graphdef: object
    params: object
    opt_state: object = None


def start_critic(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                 policy: policy_lib.Policy) -> Critic:
    """The run's starting `Critic`: loaded from ``critic.path`` (a value model export, or
    any LM checkpoint for the trunk), or the policy's starting weights with a zero head."""
    model_cfg = config.model
    if config.critic.path:
        model = models.load_value_model(config.critic.path, mesh=mesh, rules=model_cfg.rules,
                                        **models.run_overrides(model_cfg, mesh))
        vocab, policy_vocab = model.cfg.vocab_size, policy.model_config().vocab_size
        if vocab != policy_vocab:
            raise ValueError(f"critic.path {config.critic.path!r} has a vocabulary of {vocab} "
                             f"tokens, the policy {policy_vocab}: the critic reads the policy's "
                             "tokens; start it from a checkpoint of the same tokenizer")
    else:
        model = models.value_model_from(nnx.merge(policy.graphdef, policy.params), mesh=mesh,
                                        rules=model_cfg.rules)
    graphdef, params = nnx.split(model)
    return Critic(graphdef, params)


def completion_values(model: models.ValueModel,
                      rows: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """`([B, N] float32 values, aux_loss [])`: V(s_t) of each completion token's state
    (the prompt and the completion before it), in the layout of the log-probs."""
    values, aux_loss = scored_values(model, rows)
    return batch_lib.forward_layout(rows).to_completion(values), aux_loss


def scored_values(model: models.ValueModel,
                  rows: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """`completion_values` in the forward's scored layout (`batch.forward_layout`)."""
    layout = batch_lib.forward_layout(rows)
    values, aux_loss = model(**layout.inputs)
    return layout.scored(values), aux_loss


def make_value_fn(graphdef: nnx.GraphDef, mesh: jax.sharding.Mesh, *,
                  num_pieces: int) -> Callable[..., jax.Array]:
    """Jitted ``(params, rows, plan=None) -> [B, N]`` values, `B / num_pieces` rows (or
    packed rows) at a time."""
    return batch_lib.make_rows_fn(graphdef, mesh, lambda model, piece: scored_values(
        model, piece)[0], num_pieces=num_pieces, keys=batch_lib.TOKEN_KEYS)


@functools.partial(jax.jit, static_argnames=("gamma",))
def value_targets(rows: Mapping[str, jax.Array], lam: float | jax.Array, *,
                  gamma: float) -> jax.Array:
    """`[B, N]` the critic's regression targets: GAE returns (advantages + values) of the
    outcome reward over ``rows["values"]``, with the critic's `lam` (1: Monte-Carlo)."""
    token_rewards = objectives.outcome_token_rewards(rows["rewards"], rows["mask"])
    _, returns = objectives.gae(token_rewards, rows["values"], rows["mask"], gamma=gamma,
                                lam=jnp.asarray(lam, jnp.float32))
    return returns


def make_loss(
    clip: float | None,
) -> Callable[[models.ValueModel, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """The critic's loss of one micro-batch: PPO's value loss (clipped by `clip` around the
    batch's values, None for none), token-mean over the GLOBAL token count."""

    def loss_fn(model, micro):
        values, aux_loss = completion_values(model, micro)
        per_token, diagnostics = objectives.value_loss(values, micro["values"], micro["returns"],
                                                       micro["mask"], clip=clip)
        mean = functools.partial(objectives.aggregate, mask=micro["mask"], mode="token-mean",
                                 num_tokens=micro["num_tokens"])
        loss = mean(per_token)
        metrics = {"value_loss": loss, "value_clip_fraction": mean(diagnostics["value_clipped"])}
        if model.cfg.n_experts:   # as the policy's loss: micro-batches add up to 1
            share = jnp.sum(micro["mask"]) / jnp.maximum(micro["num_tokens"], 1)
            loss = loss + model.cfg.router_aux_loss_coef * aux_loss * share
        return loss, metrics

    return loss_fn


def update_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The critic's update metrics under their own names (the policy's are unprefixed)."""
    renamed = {"grad_norm": "critic_grad_norm", "grad_norm_std": "critic_grad_norm_std",
               "update_norm": "critic_update_norm"}
    return {renamed.get(k, k): v for k, v in metrics.items()}


def _token_mean(x, weights):
    return jnp.sum(x * weights) / jnp.maximum(jnp.sum(weights), 1.0)


@jax.jit
def batch_statistics(rows: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The critic on the rollout batch, before its updates: ``explained_variance`` of the
    targets by the values, ``value_mean`` and ``return_mean`` (token means), and with
    per-token advantages their mean and std in each quarter of the completion budget
    (``advantage_mean_q1`` .. ``_q4``: where along the answers the credit goes)."""
    mask = rows["mask"].astype(jnp.float32)
    stats = {"explained_variance": objectives.explained_variance(rows["values"], rows["returns"],
                                                                 mask),
             "value_mean": _token_mean(rows["values"], mask),
             "return_mean": _token_mean(rows["returns"], mask)}
    advantages = rows.get("advantages")
    if advantages is None or advantages.ndim != 2:
        return stats
    width = mask.shape[1]
    bucket = jnp.arange(width) * POSITION_BUCKETS // width
    for q in range(POSITION_BUCKETS):
        weights = mask * (bucket == q)[None, :]
        mean = _token_mean(advantages, weights)
        stats[f"advantage_mean_q{q + 1}"] = mean
        stats[f"advantage_std_q{q + 1}"] = jnp.sqrt(_token_mean(jnp.square(advantages - mean),
                                                                weights))
    return stats


def export(critic: Critic, tokenizer: transformers.PreTrainedTokenizerBase, path: str) -> None:
    """Writes the critic as transformers' ``*ForTokenClassification`` (one label), with the
    policy's tokenizer."""
    models.save_value_model(nnx.merge(critic.graphdef, critic.params), path, tokenizer=tokenizer)
    if parallel.is_main():
        print(f"exported the critic to {path}", flush=True)
