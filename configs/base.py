"""The base config: every default of every recipe, set once.

Recipes in this folder start from `get_config` here and change only the fields that
make them what they are. Nothing in grpo_jax reads a field with a fallback default,
so a field missing here is a bug, not an option.

Arguments (after the colon of a config path): ``runlocal`` shrinks the run to the tiny
CPU model and a few prompts, so any recipe runs on a laptop. Each recipe states its
paper's rollout regime with `set_regime`, which also says how ``runlocal`` scales it.
"""

from ml_collections import config_dict

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_dict.ConfigDict()
    config.seed = 0
    config.mode = "rl"                   # rl | sft | demo (sft warm start, rl, sft control) | eval
    # name=size pairs; one size may be -1 (the rest of the devices). Rows split over every
    # axis but "tensor"; weights over the axes their sharding rules name. "auto": data
    # parallel ("data=-1,fsdp=1,tensor=1") unless the weights, gradients and optimizer state
    # would take over half of a device's memory replicated, then fully sharded
    # ("data=1,fsdp=-1,tensor=1"); CPU devices report no memory and stay data parallel.
    config.mesh = "auto"

    # Several processes (one per host): jax.distributed.initialize(). With enabled and the
    # three addresses unset, JAX detects the cluster (Cloud TPU, SLURM, Open MPI); setting
    # the three starts it explicitly (also GRPO_JAX_DISTRIBUTED=1 in the environment).
    config.distributed = config_dict.ConfigDict()
    config.distributed.enabled = False
    config.distributed.coordinator_address = config_dict.placeholder(str)   # "host:port"
    config.distributed.num_processes = config_dict.placeholder(int)
    config.distributed.process_id = config_dict.placeholder(int)
    # "host:port" where this process serves the arrays other processes' devices copy from
    # it (split meshes on several processes: the parameters and the batch cross between the
    # roles); reachable from the other processes. "": the address this host reaches the
    # coordinator from, and a free port.
    config.distributed.transfer_address = ""

    # The policy: a local HF checkpoint directory, or a named shape initialised at random
    # with a character tokenizer trained on the task (the tiny CPU models).
    config.model = config_dict.ConfigDict()
    config.model.path = ""               # HF directory (config.json + safetensors + tokenizer)
    config.model.name = ""               # or a grpo_jax.models named config, e.g. "tiny"
    config.model.rules = "fsdp"          # sharding rule set for training
    config.model.dtype = "float32"       # compute dtype
    config.model.param_dtype = "float32"
    # What each layer keeps for the backward pass: "off" (everything), "full" (its input
    # only), "dots_saveable" or "dots_with_no_batch_dims_saveable" (also matmul results).
    config.model.remat = "off"
    config.model.attention = "xla"       # "xla" (any backend), "splash" (TPU kernel), "cudnn"
    # Routed experts: "ragged" (jax.lax.ragged_dot, k/E of the FLOPs), "dense" (every expert
    # on every token: faster on CPU), "auto" (dense on CPU devices, ragged elsewhere).
    config.model.moe = "auto"
    # Runs of identical layers under jax.lax.scan over stacked weights: one compiled layer
    # body per run instead of one per layer (same network; HF checkpoints load either way).
    config.model.scan_layers = False
    # Low-rank adapters (LoRA, arXiv:2106.09685) on the projections `targets` selects
    # (fnmatch over attn.q/k/v/o and mlp.gate/up/down, routed experts' included, or bare
    # names: "q"); rank 0 trains every weight. With rank > 0 only the adapters are trained,
    # held by the optimizer and checkpointed; the frozen base with adapters off is the KL
    # reference.
    config.model.lora = config_dict.ConfigDict()
    config.model.lora.rank = 0
    config.model.lora.alpha = 32.0        # scale alpha / rank (32: "LoRA Without Regret")
    config.model.lora.targets = ("attn.*", "mlp.*")
    config.model.lora.dropout = 0.0       # p on the adapters' input when training (QLoRA: 0.05-0.1)
    config.model.lora.quantize = ""       # QLoRA: the frozen base's projections as "int8" or "int4"
    # Start RL from a supervised warm start of model.name, built once with the sft section
    # below and cached under task.data_dir (RL from a random model has no signal at all).
    config.model.sft_warm_start = False

    # The task: a grpo_jax.data builder and its knobs, the prompt format, the rewards.
    config.task = config_dict.ConfigDict()
    config.task.name = "gsm8k"
    config.task.knobs = config_dict.ConfigDict()   # passed to the builder's config class
    config.task.data_dir = "~/tensorflow_datasets"
    config.task.manual_dir = ""          # the official files of gsm8k, math500, math, ...
    config.task.chat_template = False    # format prompts with the tokenizer's chat template
    # A model family's prompt around the question (grpo_jax.data.templates: "qwen25_math",
    # "qwen3_thinking", "r1_zero", "r1_distill"), instead of the task's own prompt; "" = off.
    config.task.prompt_template = ""
    config.task.system_prompt = ""
    # Worked examples before the question, ((question, answer text), ...): earlier chat
    # turns, or prompt + answer paragraphs in a plain prompt (e.g. a base model's one-shot).
    config.task.shots = ()
    config.task.eval_split = "test"
    # Several processes: "main" builds the dataset in process 0 while the others wait (a
    # data_dir every host shares); "every" builds it in each process (per-host local dirs).
    config.task.prepare_on = "main"

    # Registered grpo_jax.rewards as (name, weight) pairs: summed with the weights, or
    # kept as [B, K] columns when objective.advantage.estimator is "gdpo".
    config.reward = config_dict.ConfigDict()
    config.reward.specs = (("gsm8k", 1.0),)
    config.reward.correct = "gsm8k"      # the reward whose value 1 means "correct" (accuracy)
    config.reward.timeout_s = 10.0       # per row, for graders that run in the process pool

    # Rollouts: P prompts x G completions, a prompt's G rows consecutive (docs/semantics.md).
    # P, G, the budget and the updates per batch are the recipe's regime (set_regime).
    config.rollout = config_dict.ConfigDict()
    config.rollout.prompts_per_batch = 64
    config.rollout.max_new_tokens = 1024
    config.rollout.temperature = 1.0     # log-probs in every ratio and KL use it too
    config.rollout.top_p = 1.0           # at most one of top_p < 1, top_k > 0, min_p > 0;
    config.rollout.top_k = 0             # none of them: no truncation step runs at all
    config.rollout.min_p = 0.0
    config.rollout.rules = "sampling"    # weights' sharding rule set while sampling
    # The sampler's precision: "" samples with the trainer's parameters in model.dtype; a
    # dtype ("bfloat16") samples with a copy of the weights cast to it, computing in it (as
    # a bf16 inference engine for an fp32 trainer), cast once each time the parameters are
    # published to the sampler. behaviour_logp is then the low-precision policy's, so the
    # mismatch/* metrics measure the gap and objective.importance can correct it.
    # "float8_e4m3fn" / "float4_e2m1fn": weight-only FP8 / FP4 (block scales), bf16 compute.
    config.rollout.dtype = ""
    # Simulated staleness in the synchronous loop: the rollouts of step t come from the
    # parameters of step t - policy_lag (0: the current ones). The lagged copies are kept
    # and checkpointed. async_rl below runs the same schedule with the rollouts overlapped.
    config.rollout.policy_lag = 0
    # DeepSeek-V3.2's keep sampling mask: the top-p/top-k set of every sampled position is
    # kept, and pi_old and pi_theta are both renormalised over it (needs a truncation).
    config.rollout.keep_sampling_mask = False
    # ... and keep routing: an MoE's training forward replays the sampler's experts.
    config.rollout.keep_routing = False
    # Continuous batching: decode in this many slots, a stopped row's slot going to the
    # next pending one (0: every row of the batch at once). The same samples either way.
    config.rollout.slots = 0
    # Paged KV cache for the slots (docs/sampling.md, "Paged KV cache"): tokens per page of
    # a pool shared by all slots, pages taken as rows grow and freed when they stop (0: each
    # slot keeps its own prompt + max_new_tokens columns). Needs slots > 0; the same samples.
    config.rollout.kv_page_size = 0
    # ... the pool's completion pages (0: enough for every slot's full budget; fewer make
    # admission wait for pages and may preempt and re-queue the latest rows).
    config.rollout.kv_pages = 0
    # Split meshes: "" samples on the training mesh; name=size pairs (e.g. "data=4": axes
    # left out have size 1) take that many of the last devices for a mesh of their own
    # that samples, the training mesh (config.mesh) taking the rest. The parameters go to
    # it after each update and the batch comes back (cross-mesh copies, timed). With
    # async_rl the two meshes work at the same time. One process.
    config.rollout.mesh = ""
    # Partial rollouts (docs/async.md; Kimi k1.5, arXiv:2501.12599, sec. 2.6.2): a row
    # samples at most tokens_per_step tokens a step; one not done by then carries over and
    # goes on at the next step under the new parameters (its tokens so far keep the
    # log-probs they were sampled with). A group enters a batch once its G rows are done;
    # while fewer than P are, a step draws more prompts (up to filtering.max_gen_batches
    # draws, the pool holding at most (max_carries + 1) P groups), then runs the oldest to
    # their end. A row carries over at most max_carries times (the step after, it runs to
    # its end). One process.
    config.rollout.partial = config_dict.ConfigDict()
    config.rollout.partial.enabled = False
    config.rollout.partial.tokens_per_step = 256
    config.rollout.partial.max_carries = 2

    # Asynchronous RL (docs/async.md): a producer thread samples the next steps' rollouts
    # while the learner updates. A batch trained at step t was sampled by the parameters
    # step t - j started from, j <= max_staleness (the newest available; with fixed, exactly
    # max_staleness: the schedule of rollout.policy_lag = max_staleness). One process.
    config.async_rl = config_dict.ConfigDict()
    config.async_rl.enabled = False
    config.async_rl.max_staleness = 1
    config.async_rl.fixed = False

    # Multi-turn rollouts with tools (docs/environments.md): the model's tool calls are
    # answered by the environment, whose tokens the model reads and the loss skips. An
    # episode's rollout.max_new_tokens covers its replies too. One process only.
    config.environment = config_dict.ConfigDict()
    config.environment.name = ""         # "" (single-turn) or grpo_jax.environments.ENVIRONMENTS
    config.environment.max_calls = 4     # tool calls per episode; one more ends the episode
    config.environment.turn_budget = 0   # > 0: a turn that samples this many tokens ends it
    config.environment.max_append = 32   # tokens of one reply (longer ones are cut)
    config.environment.timeout_s = 10.0  # per step, in the worker processes
    # "" : a tool's output in the environment's own format inside the model's turn
    # (`<result>...</result>`); a role ("tool", "user"): each reply a turn of that role in
    # the tokenizer's chat template, closing the model's turn and opening its next one
    # (needs task.chat_template).
    config.environment.chat_role = ""

    config.train = config_dict.ConfigDict()
    config.train.steps = 200
    config.train.epochs = 1              # passes over each rollout batch
    config.train.minibatches = 1         # optimizer steps per pass: epochs x minibatches
                                         # updates per rollout batch, off-policy after the first
    config.train.micro_batches = 1       # gradient accumulation per optimizer step
    # Packed forward passes (pi_old, pi_ref, values, updates): each piece's real tokens laid
    # end to end in fewer rows of the padded width, attention kept inside each sequence.
    # "auto": on where it pays (long budgets; see docs/performance.md), "on", "off".
    config.train.packing = "auto"
    # pi_old in the ratio: "recompute" = the trainer's forward pass with the parameters that
    # sampled (the sampler's own log-probs stay available as behaviour_logp, for
    # objective.importance to correct sampler/trainer mismatch); "sampler" = the sampler's
    # log-probs themselves (no extra forward pass, no correction possible).
    config.train.old_logp = "recompute"
    config.train.eval_every = 50
    config.train.eval_at_start = False   # also evaluate the starting policy, as step 0's row
    config.train.checkpoint_every = 25
    config.train.keep_checkpoints = 3    # >= 1: the newest is the one a re-run resumes from
    config.train.ref_reset_every = 0     # > 0: the KL reference becomes the policy every N steps
    # > 0: add sft_weight x the NLL of the step's prompts' reference solutions to the RL loss
    # (a hybrid of RL and supervised next-token prediction, as RPT's hybrid objective).
    config.train.sft_weight = 0.0
    config.train.export = True           # save_pretrained(workdir/export) at the end
    config.train.log_rollouts_every = 0  # > 0: the batch's texts and rewards to workdir/rollouts/

    config.optimizer = _optimizer(learning_rate=1e-6)

    # Supervised warm start (mode sft / demo): reference solutions of the train split.
    config.sft = config_dict.ConfigDict()
    config.sft.steps = 1000
    config.sft.batch_size = 64
    config.sft.optimizer = _optimizer(learning_rate=1e-4)
    config.sft.log_every = 50
    config.sft.eval_every = 500
    config.sft.checkpoint_every = 500

    config.eval = config_dict.ConfigDict()
    config.eval.num_prompts = 500        # held-out prompts; greedy pass@1 on each
    config.eval.samples = 4              # k for mean@k / pass@k at rollout.temperature (0: none)
    # mode=eval over a named suite (grpo_jax.training.suites: "math_reasoning",
    # "dapo_aime24", "oat_zero") instead of task.eval_split: eval.samples answers per
    # problem of each benchmark at the suite's temperature and top-p; avg@k, pass@k, maj@k
    # per benchmark and macro-averaged. RL's evaluation every train.eval_every steps, and
    # SFT's every sft.eval_every (not the warm start's), also logs them
    # (eval_suite/<benchmark>/<metric>, docs/metrics.md). suite_dir holds
    # <benchmark>/<its release file> (docs/data-and-rewards.md); suite_problems > 0 takes
    # only each benchmark's first n. suite_dir, distill.teacher_path and the knob
    # task.knobs.benchmarks_dir are paths: a run makes them absolute against the current
    # directory once, at its start (config_lib.resolve_paths), as model.path.
    config.eval.suite = ""
    config.eval.suite_dir = ""
    config.eval.suite_problems = 0

    # DAPO dynamic sampling: keep only groups with signal (filtering.signal), drawing more
    # prompt batches until the train batch is full, up to max_gen_batches (which also bounds the
    # draws of a step with partial rollouts, whose groups count once all rows are done).
    config.filtering = config_dict.ConfigDict()
    config.filtering.dynamic_sampling = False
    config.filtering.max_gen_batches = 3
    # When max_gen_batches draws still leave the batch short: "error" stops with a message
    # (DAPO's behaviour: keep drawing until full); "pad" tops it up with masked groups.
    config.filtering.short_batch = "error"
    # What "a group has signal" is judged on: "correct" (DAPO, arXiv:2503.14476, eq. 11:
    # keep a prompt while 0 < #correct < G, so shaping terms such as the soft overlong
    # penalty never make an all-wrong group count) or "reward" (the rewards entering the
    # advantages differ; for graded rewards, e.g. the fraction of unit tests passed).
    config.filtering.signal = "correct"

    config.objective = _objective()
    # Adaptive entropy control (Skywork-OR1, arXiv:2505.22312; TRL's use_adaptive_entropy):
    # the entropy bonus's coefficient becomes run state, starting at objective.entropy_coef.
    # RL step k applies c_k if the previous step's mean token entropy was <= target, else 0;
    # then c_{k+1} = min(c_k + delta, high) if this step's entropy <= target, else
    # max(c_k - delta, low). Checkpointed (grpo_jax/training/entropy_control.py). With
    # enabled=False a field changed from its default here is refused (nothing reads it).
    config.adaptive_entropy = config_dict.ConfigDict()
    config.adaptive_entropy.enabled = False
    config.adaptive_entropy.target = 0.2     # nats, the mean token entropy to stay above
    config.adaptive_entropy.delta = 0.005    # the coefficient's step per RL step
    config.adaptive_entropy.low = 0.0        # its bounds
    config.adaptive_entropy.high = 1.0

    # PPO's critic (objective.advantage.estimator = "gae"): the policy's decoder with a
    # scalar head, its own optimizer, trained on the policy's minibatches.
    config.critic = config_dict.ConfigDict()
    config.critic.enabled = False
    config.critic.path = ""              # HF checkpoint to start from; "" = the policy's start
    config.critic.lam = 0.95             # GAE lambda of its targets (VAPO: 1, decoupled)
    # PPO's clip of the values around the batch's; None = unclipped value loss
    config.critic.value_clip = config_dict.FieldReference(0.2, field_type=float)
    # VAPO's value pre-training: this many steps before train.steps train only the critic,
    # on rollouts of the frozen starting policy, toward Monte-Carlo returns (lambda = 1).
    config.critic.pretrain_steps = 0
    config.critic.optimizer = _optimizer(learning_rate=2e-6)

    # On-policy distillation (docs/objectives.md): a frozen teacher scores the sampled tokens
    # and each token's advantage gains weight * (log pi_teacher - log pi_old), the negative
    # reverse KL. With objective.advantage.estimator = "reverse_kl" that term is the whole
    # advantage (no reward read; weight must be 1).
    config.distill = config_dict.ConfigDict()
    config.distill.teacher_path = ""     # HF checkpoint, the policy's tokenizer; "" = off
    config.distill.weight = 1.0          # w: A_t = A_reward + w (log pi_T - log pi_old)

    if arg.runlocal:
        _runlocal(config)
    set_regime(config, prompts=64, group_size=8, updates=1, max_new_tokens=1024,
               learning_rate=1e-6, warmup_steps=10, runlocal=arg.runlocal)
    return config


def set_regime(config, *, prompts, group_size, updates, max_new_tokens, learning_rate,
               warmup_steps, runlocal):
    """A paper's rollout regime, or its ``runlocal`` scaling.

    The regime: `prompts` x `group_size` answers per rollout batch, `updates` optimizer
    steps on each batch (train.minibatches, one epoch; from the second on the policy is
    off the one that sampled), a completion budget, the learning rate and its warmup.

    ``runlocal`` keeps the shape and scales the sizes to the tiny CPU model: 16 prompts x
    min(G, 4) answers, min(updates, 4) updates (still off-policy where the paper is),
    48 new tokens (a 3-digit addition scratchpad is at most 37 with its stop token, so
    DAPO's soft overlong zone, the last fifth from 38.4 on, punishes only longer
    answers), learning rate 1e-4 (a 0.66M-parameter model moves little at 1e-6) with at
    most 5 warmup steps.
    """
    if runlocal:
        prompts, group_size, updates = 16, min(group_size, 4), min(updates, 4)
        max_new_tokens, learning_rate, warmup_steps = 48, 1e-4, min(warmup_steps, 5)
    config.rollout.prompts_per_batch = prompts
    config.objective.group_size = group_size
    config.train.minibatches, config.train.epochs = updates, 1
    config.rollout.max_new_tokens = max_new_tokens
    config.optimizer.learning_rate = learning_rate
    config.optimizer.warmup_steps = warmup_steps


def _runlocal(config):
    """The tiny CPU setting: a 0.6M-parameter model on 3-digit addition, minutes per run."""
    config.model.name = "tiny"
    config.model.sft_warm_start = True
    config.task.name = "arithmetic"
    config.task.knobs = config_dict.ConfigDict(dict(
        digits=3, ops=("+",), scratchpad=True, teacher_fraction=0.5, forget_carry_p=1.0,
        num_train=20_000, num_test=500))
    config.task.data_dir = "~/tensorflow_datasets/grpo_jax_runlocal"
    config.reward.specs = (("integer_answer", 1.0),)
    config.reward.correct = "integer_answer"
    config.train.steps = 20
    config.train.eval_every = 10
    config.train.checkpoint_every = 10
    config.sft.steps = 300
    config.sft.optimizer.learning_rate = 1e-3
    config.eval.num_prompts = 200


def _optimizer(learning_rate):
    opt = config_dict.ConfigDict()
    opt.learning_rate = learning_rate
    opt.warmup_steps = 10
    opt.schedule = "constant"            # constant | cosine | linear (decay after warmup)
    opt.b1, opt.b2, opt.eps = 0.9, 0.999, 1e-8
    opt.weight_decay = 0.0
    opt.grad_clip = 1.0
    return opt


def _objective():
    """The `objective` section that `grpo_jax.objectives.policy_objective` reads.

    Its fields and defaults are `grpo_jax.objectives.ObjectiveSpec`'s (whose docstring
    says what each means and its flat keyword): one definition for recipes and presets.
    """
    from grpo_jax.objectives import ObjectiveSpec
    return config_lib.objective_section(ObjectiveSpec(group_size=8))
