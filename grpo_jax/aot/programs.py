"""The run's compiled programs, lowered from abstract inputs on a mesh of any devices.

Every input is a `jax.ShapeDtypeStruct` carrying the sharding the run gives it, so a
program lowers for devices that are not there (a TPU topology's abstract devices) and no
memory is allocated. The programs are the RL loop's own (`training.programs` builds them for
`rl.train` and for this report alike):

| program | function | shape |
|---|---|---|
| train | `steps.make_update_step` (forward, backward, optimizer) | one minibatch of the batch |
| logprob | `batch.make_logprob_fn` (pi_old, pi_ref) | the whole batch |
| prefill | `Decoder.prefill` of the prompts, sampling layout | P prompts x S |
| decode | one `Decoder.decode_step`, sampling layout | P G rows, a cache of S + N slots |
| | with ``rollout.slots`` = C: one continuous-batching step (`sampling.engine_step`: sample, decode, admit) | C slots of S + N columns, the P prompts' cache |
| critic_train | the critic's `steps.make_update_step` (``critic.enabled``) | one minibatch |
| values | `critic.make_value_fn`, the critic's values (``critic.enabled``) | the whole batch |

With ``train.packing`` on (`training.programs.packs`), train, logprob, critic_train and
values are the packed programs, at their largest plan (`packing_plans`).
"""  # noqa: E501 (a table: rows stay whole)

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.layout import Format, Layout

from grpo_jax import models, parallel, sampling
from grpo_jax.aot import kv
from grpo_jax.models import sharding as sharding_lib
from grpo_jax.training import async_rl, distill, packing, programs as programs_lib, rl_checks
from grpo_jax.training import rollout
from grpo_jax.training import policy as policy_lib, steps
from grpo_jax.training.footprint import model_config


@dataclasses.dataclass
class Program:
    """One program ready to compile.

    Attributes:
      name: "train", "logprob", "prefill" or "decode".
      lowered: its `jax.stages.Lowered`.
      held: per-device bytes of the run's state that stays in memory while it runs but
        is not among its arguments (the optimizer state while sampling, ...).
      shape: what it was lowered for, in words.
      parts: per-device bytes of the run's state among its arguments and outputs, by name:
        "weights", "optimizer" (its state), "cache" (the KV cache), for the advice on what to
        change.
      held_state: of `held`, the training weights, optimizer state and their copies
        (pi_ref, lagged policies), and the distillation teacher's weights: what sharding
        the weights over more chips shrinks.
    """

    name: str
    lowered: object
    held: int
    shape: str
    parts: dict = dataclasses.field(default_factory=dict)
    held_state: int = 0


def abstract(tree, shardings):
    """`ShapeDtypeStruct`s of `tree`'s leaves carrying `shardings` (a tree of the same shape)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def device_bytes(tree):
    """Bytes one device holds of a tree of sharded `ShapeDtypeStruct`s (the most loaded one)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jax.dtypes.itemsize_bits(x.dtype) // 8
               for x in jax.tree.leaves(tree))


def batch_rows(config, cfg, mesh, prompt_len):
    """The rollout batch the loop trains on (`training.programs.batch_layout`, what
    rl.train checks its batches against), as abstract `[B, ...]` rows of a model `cfg`."""
    layout = programs_lib.batch_layout(config, cfg, prompt_len)
    sharding = parallel.rows_sharding(mesh, layout["mask"][0][0])
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
            for k, (shape, dtype) in layout.items()}


def sft_rows(config, mesh, prompt_len):
    """With ``train.sft_weight``, the supervised rows each update also reads (the P
    prompts and their reference solutions, `task.target_rows`) and one update's index."""
    p, s, n = config.rollout.prompts_per_batch, prompt_len, config.rollout.max_new_tokens
    shapes = {"prompt_tokens": (p, s), "prompt_mask": (p, s), "tokens": (p, n), "mask": (p, n)}
    sharding = parallel.rows_sharding(mesh, p)
    rows = {
        k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for k, shape in shapes.items()
    }
    rows["row_valid"] = jax.ShapeDtypeStruct((p,), bool, sharding=sharding)
    index = jax.ShapeDtypeStruct((p // config.train.minibatches,), jnp.int32,
                                 sharding=jax.NamedSharding(mesh, jax.P()))
    return rows, index


def _params(state, mesh, rules):
    """The abstract weights in the layout of the sharding `rules`."""
    return abstract(state, sharding_lib.state_shardings(state, mesh, rules))


def build(config, mesh, *, prompt_len, rollout_mesh=None, layers=None):
    """The run's programs for `config` on `mesh`, lowered (not compiled).

    Args:
      config: a run config (configs/*.py), its overrides applied.
      mesh: a `jax.sharding.Mesh`, e.g. of a TPU topology's abstract devices.
      prompt_len: S, the prompt bucket (the completion buffer N is rollout.max_new_tokens).
      rollout_mesh: with split meshes (``rollout.mesh``), the devices the sampler runs
        on: prefill and decode are lowered there, holding nothing of the training state.
      layers: the model's first `layers` layers only (None: all): the split plan's time
        estimates extrapolate from 1- and 2-layer programs (`aot.plan`).

    Returns:
      A list of `Program`s: train, logprob, prefill, decode (and critic_train, values
      with ``critic.enabled``).
    """
    rl_checks.check_config(config, mesh)
    cfg = model_config(config, mesh)
    if layers is not None:
        cfg = dataclasses.replace(cfg, n_layers=layers)
    rl_checks.check_model(config, cfg)
    graphdef, state = models.abstract_model(cfg)
    params = models.quantize_base(_params(state, mesh, config.model.rules), cfg.lora)
    objective = programs_lib.rl_objective(config)
    run = programs_lib.policy_programs(config, mesh, graphdef, params, objective)
    opt_state = abstract(jax.eval_shape(run.tx.init, run.trained_part(params)), run.opt_shardings)
    rows = batch_rows(config, cfg, mesh, prompt_len)
    b = rows["mask"].shape[0]
    minibatch = b // config.train.minibatches
    index = jax.ShapeDtypeStruct((minibatch,), jnp.int32, sharding=jax.NamedSharding(mesh, jax.P()))
    params_bytes, opt_bytes = device_bytes(params), device_bytes(opt_state)
    # pi_ref's weights (none with LoRA: the base with adapters off) and the lagged copies
    # of the trained part (all weights, or the adapters)
    copy_bytes = (policy_lib.owns_reference(config) * params_bytes
                  + async_rl.lagged_copies(config) * device_bytes(run.trained_part(params))
                  + _teacher_bytes(config, mesh, layers))
    pieces = run.pieces
    plans = packing_plans(config, mesh, rows, pieces)
    critic, critic_bytes = _critic_programs(config, mesh, cfg, rows, index, pieces, plans,
                                            held=params_bytes + opt_bytes + copy_bytes)
    update, logprob = run.update, run.forward
    supervised = sft_rows(config, mesh, prompt_len) if config.train.sft_weight else ()
    dropout = {}   # the adapters' dropout key (model.lora.dropout > 0), as rl.train passes it
    if steps.drops_adapter_inputs(config):
        key = jax.eval_shape(lambda: jax.random.key(0))
        dropout["rng"] = jax.ShapeDtypeStruct((), key.dtype, sharding=index.sharding)
    n, s = config.rollout.max_new_tokens, prompt_len
    seq = f"S={s}+N={n}" + (", packed" if plans[0] is not None else "")
    with jax.set_mesh(mesh):
        programs = [
            Program("train", update.lower(params, opt_state, rows, index, *supervised,
                                          plan=plans[0], **dropout),
                    copy_bytes + critic_bytes,
                    f"{minibatch} rows x {seq} in {config.train.micro_batches} micro-batch(es)",
                    {"weights": params_bytes, "optimizer": opt_bytes}, copy_bytes),
            Program("logprob", logprob.lower(params, rows, plans[1]),
                    opt_bytes + copy_bytes + critic_bytes,
                    f"{b} rows x {seq} in {pieces} piece(s)", {"weights": params_bytes},
                    opt_bytes + copy_bytes),
        ]
    training_state = params_bytes + opt_bytes + copy_bytes
    held = dict(held=training_state + critic_bytes + device_bytes(rows), held_state=training_state)
    if rollout_mesh is not None:   # devices of its own: its weights, cache and prompts only
        held = dict(held=0, held_state=0)
    sampler_mesh = mesh if rollout_mesh is None else rollout_mesh
    with jax.set_mesh(sampler_mesh):
        programs += _sampler_programs(config, sampler_mesh, cfg, params, prompt_len, **held)
    return programs + critic


def _teacher_bytes(config, mesh, layers):
    """Per-device bytes of the frozen distillation teacher's weights (0 without
    ``distill.teacher_path``), sharded by ``model.rules`` as `distill.load_teacher` loads
    them; its first `layers` layers when the policy is cut to them. The teacher's own
    log-prob pass is not lowered: it is the logprob program with the teacher's weights."""
    cfg = distill.teacher_model_config(config, mesh)
    if cfg is None:
        return 0
    if layers is not None:
        cfg = dataclasses.replace(cfg, n_layers=layers)
    return device_bytes(_params(models.abstract_model(cfg)[1], mesh, config.model.rules))


def packing_plans(config, mesh, rows, pieces):
    """`(update plan, forward plan)` as abstract arrays when the run packs its forward
    passes (`programs.packs`), else `(None, None)`. Their sizes are the largest the run
    can meet (every row at the full width, so no two share a packed row): what bounds
    the programs' memory; ragged batches run the same programs on fewer packed rows."""
    if not programs_lib.packs(config):
        return None, None
    b, n = rows["mask"].shape
    width = rows["prompt_tokens"].shape[1] + n - 1
    micro = config.train.micro_batches
    micro_rows = b // config.train.minibatches // micro

    def plan(lead, rows_per, back):
        shapes = {k: (*lead, rows_per, width) for k in packing.ROW_KEYS}
        shapes["pack_back"] = back
        return {
            k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=packing.plan_sharding(shape, mesh))
            for k, shape in shapes.items()
        }

    return (plan((micro,), micro_rows, (micro, micro_rows, n)),
            plan((pieces,), b // pieces, (b, n)))


def _critic_programs(config, mesh, cfg, rows, index, pieces, plans, *, held):
    """The critic's update and value pass (``critic.enabled``: PPO, VAPO), built as
    `rl.train` builds them; `held` is the policy's state, in memory meanwhile. Returns
    `[]` without a critic. The critic is the policy's network with a scalar head
    (`models.ValueModel`), its weights sharded by ``model.rules``, its own optimizer.

    Returns:
      `(programs, bytes)`: the two `Program`s, and the per-device bytes of the critic's
      weights and optimizer state (held while the policy's programs run); `([], 0)`
      without a critic.
    """
    if not config.critic.enabled:
        return [], 0
    graphdef, state = models.abstract_value_model(cfg)
    params = _params(state, mesh, config.model.rules)
    run = programs_lib.critic_programs(config, mesh, graphdef, params)
    opt_state = abstract(jax.eval_shape(run.tx.init, run.trained_part(params)), run.opt_shardings)
    update, values = run.update, run.forward
    b, seq = rows["mask"].shape[0], f"S={rows['prompt_tokens'].shape[1]}+N={rows['mask'].shape[1]}"
    with jax.set_mesh(mesh):
        programs = [
            Program(
                "critic_train", update.lower(params, opt_state, rows, index, plan=plans[0]), held,
                f"{index.shape[0]} rows x {seq} in {config.train.micro_batches} micro-batch(es)",
                {"weights": device_bytes(params), "optimizer": device_bytes(opt_state)},
            ),
            Program(
                "values", values.lower(params, rows, plans[1]), held + device_bytes(opt_state),
                f"{b} rows x {seq} in {pieces} piece(s)", {"weights": device_bytes(params)},
            ),
        ]
    return programs, device_bytes(params) + device_bytes(opt_state)


def _sampler_programs(config, mesh, cfg, train_params, prompt_len, *, held, held_state):
    """Prefill of the P prompts and one decode step of the P G rows (with ``rollout.slots``,
    one step of the engine: `_engine_program`), in the sampling layout.

    The sampler reshards the weights to ``rollout.rules`` inside its program, so while it
    runs a chip holds both layouts (unless they are the same); `held` counts the rest
    of the run's state (training weights, optimizer state, pi_ref, the last batch), of
    which `held_state` is the training weights, optimizer state and copies.
    """
    p, g = config.rollout.prompts_per_batch, config.objective.group_size
    s, n = prompt_len, config.rollout.max_new_tokens
    graphdef, state = models.abstract_model(cfg)
    params = models.quantize_base(_params(state, mesh, config.rollout.rules), cfg.lora)
    same_layout = jax.tree.leaves(
        jax.tree.map(lambda a, b: a.sharding == b.sharding, params, train_params)
    )
    if all(same_layout):
        held -= device_bytes(train_params)
        held_state -= device_bytes(train_params)
    prompts = jax.ShapeDtypeStruct((p, s), jnp.int32, sharding=parallel.rows_sharding(mesh, p))

    def prefill(state, tokens, mask):
        model = nnx.merge(graphdef, state)
        return model.prefill(tokens, model.init_cache(p, s), attention_mask=mask)

    def decode(state, tokens, cache):
        return nnx.merge(graphdef, state).decode_step(tokens, cache)

    def empty_cache(state):
        model = nnx.merge(graphdef, state)
        return model.init_cache(p * g, n, prefix=model.init_cache(p, s))

    prompt_cache_shapes = jax.eval_shape(prefill, params, prompts, prompts)[1]
    prompt_cache_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=kv.cache_sharding(x, mesh, cfg.scan_layers)),
        prompt_cache_shapes)
    prompt_cache = jax.tree.map(lambda x: x.sharding, prompt_cache_shapes)
    prefill = jax.jit(
        prefill, out_shardings=(parallel.rows_sharding(mesh, p), layouts(prompt_cache))
    )
    weights = device_bytes(params)
    programs = [
        Program(
            "prefill", prefill.lower(params, prompts, prompts), held, f"{p} prompts x S={s}",
            {"weights": weights, "cache": device_bytes(prompt_cache_shapes)}, held_state,
        )
    ]
    if config.rollout.slots and config.rollout.kv_page_size:
        return programs + [_paged_program(config, mesh, cfg, graphdef, params, prompts,
                                          held=held, held_state=held_state)]
    if config.rollout.slots:
        return programs + [_engine_program(config, mesh, cfg, graphdef, params, prompts,
                                           held=held, held_state=held_state)]
    # The sampler's cache never leaves its program, so XLA lays it out as the loop body
    # wants; as an argument in the default layout, a stacked cache would be copied whole
    # into that layout and back (`layouts`). Logits: rows over the row axes.
    cache = jax.eval_shape(empty_cache, params)
    cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=kv.cache_sharding(x, mesh, cfg.scan_layers)), cache)
    tokens = jax.ShapeDtypeStruct((p * g,), jnp.int32, sharding=parallel.rows_sharding(mesh, p * g))
    shardings = parallel.tree_shardings
    decode = jax.jit(decode, donate_argnums=2,
                     in_shardings=(shardings(params), tokens.sharding, layouts(shardings(cache))),
                     out_shardings=(parallel.rows_sharding(mesh, p * g), layouts(shardings(cache))))
    return programs + [
        Program("decode", decode.lower(params, tokens, cache), held,
                f"{p * g} rows, cache S={s} (shared) + N={n}",
                {"weights": weights, "cache": device_bytes(cache)}, held_state),
    ]


def _engine_program(config, mesh, cfg, graphdef, params, prompts, *, held, held_state):
    """One step of the continuous-batching engine (``rollout.slots`` = C), as "decode":
    the C slots sample, decode one token each over their S + N columns, and free slots
    copy in their next row's prompt from the P prompts' prefilled cache."""
    p, s = prompts.shape
    g, n, c = config.objective.group_size, config.rollout.max_new_tokens, config.rollout.slots
    method = rollout.sampling_method(config)

    def start(state, tokens):   # the records the run keeps are in the carry
        model = nnx.merge(graphdef, state)
        logits, prompt_cache, _, records = sampling.prefill_prompts(
            model, tokens, jnp.ones_like(tokens), method=method,
            record_support=config.rollout.keep_sampling_mask,
            record_routing=bool(rollout.routing_keys(config, cfg)))
        slots = sampling.init_slots(model, logits, rows=p * g, prompt_len=s, buffer_len=n,
                                    num_slots=c, pad_id=0, **records)
        return slots, prompt_cache, logits, sampling.row_keys(jax.random.key(0), jnp.arange(p), g)

    def place(x, sharding=None):
        if sharding is None:
            sharding = (
                parallel.rows_sharding(mesh, x.shape[0])
                if x.ndim
                else jax.NamedSharding(mesh, jax.P())
            )
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    slots, prompt_cache, logits, keys = jax.eval_shape(start, params, prompts)
    caches = jax.tree.map(lambda x: place(x, kv.cache_sharding(x, mesh, cfg.scan_layers)),
                          (slots.cache, prompt_cache))
    slots = jax.tree.map(place, slots.replace(cache=None)).replace(cache=caches[0])
    prompt_cache, logits, keys = caches[1], place(logits), place(keys)
    budgets = place(jax.ShapeDtypeStruct((p * g,), jnp.int32))
    stop_tokens = place(jax.ShapeDtypeStruct((1,), jnp.int32))

    def step(state, slots, prompt_cache, logits, keys, budgets, stop_tokens):
        return sampling.engine_step(
            graphdef, state, slots, prompt_cache, logits, keys, budgets, method=method,
            stop_tokens=stop_tokens, pad_id=0, group_size=g, batch_axes=parallel.row_axes(mesh),
            ways=parallel.row_ways(mesh),
        )

    lowered = jax.jit(step, donate_argnums=1).lower(params, slots, prompt_cache, logits, keys,
                                                   budgets, stop_tokens)
    return Program("decode", lowered, held,
                   f"{c} slots for {p * g} rows, cache S={s}+N={n} per slot (continuous batching)",
                   {"weights": device_bytes(params),
                    "cache": device_bytes(slots.cache) + device_bytes(prompt_cache)}, held_state)


def _paged_program(config, mesh, cfg, graphdef, params, prompts, *, held, held_state):
    """The paged engine's whole call (``rollout.kv_page_size`` with ``rollout.slots``), as
    "decode": `sampling._paged.generate_paged`, the prompts' prefill and the loop over its
    page pool (``rollout.kv_pages`` completion pages; 0: every slot's budget), which lives
    inside the program. Its "cache" part is the pool's bytes by arithmetic (`aot.kv`),
    split over the row ways as the compiler stores it (docs/tpu.md)."""
    from grpo_jax.sampling import _paged
    p, s = prompts.shape
    g, n, c = config.objective.group_size, config.rollout.max_new_tokens, config.rollout.slots
    page, c = config.rollout.kv_page_size, min(c, p * g)
    m = _paged.pool_pages(c, n, page, config.rollout.kv_pages)
    _paged.check_pages(c, n, page, config.rollout.kv_pages)
    one = jax.NamedSharding(mesh, jax.P())
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=one)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=one)
    ids = jax.ShapeDtypeStruct((p,), jnp.int32, sharding=parallel.rows_sharding(mesh, p))
    stops = jax.ShapeDtypeStruct((1,), jnp.int32, sharding=one)
    lowered = _paged.generate_paged.lower(
        graphdef, params, prompts, prompts, key, ids, rollout.sampling_method(config), stops,
        scalar, scalar, group_size=g, buffer_len=n, num_slots=c, page_size=page, kv_pages=m,
        rules=config.rollout.rules, record_support=config.rollout.keep_sampling_mask)
    pool = kv.paged_kv_bytes(kv.kv_layout(cfg, mesh), prompts=p, prompt_len=s, pages=m,
                             page=page, pool_ways=parallel.row_ways(mesh))
    return Program("decode", lowered, held,
                   f"{c} paged slots for {p * g} rows, pool of {m} + {p * -(-s // page)} "
                   f"pages of {page} (whole call: prefill and loop)",
                   {"weights": device_bytes(params), "cache": pool}, held_state)


def layouts(shardings):
    """Each sharding with the memory layout left to the compiler (`Layout.AUTO`)."""
    return jax.tree.map(lambda s: Format(Layout.AUTO, s), shardings)

