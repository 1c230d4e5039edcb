"""The base config: every default of every recipe, set once.

Recipes in this folder start from `get_config` here and change only the fields that
make them what they are. Nothing in grpo_jax reads a field with a fallback default,
so a field missing here is a bug, not an option.

Arguments (after the colon of a config path): ``runlocal`` shrinks the run to the tiny
CPU model and a few prompts, so any recipe runs on a laptop.
"""

from ml_collections import config_dict

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_dict.ConfigDict()
    config.seed = 0
    config.mode = "rl"                   # rl | sft | demo (sft warm start, rl, sft control)
    config.mesh = (("data", -1), ("fsdp", 1), ("tensor", 1))
    config.distributed = False           # jax.distributed.initialize() (also GRPO_JAX_DISTRIBUTED=1)

    # The policy: a local HF checkpoint directory, or a named shape initialised at random
    # with a character tokenizer trained on the task (the tiny CPU models).
    config.model = config_dict.ConfigDict()
    config.model.path = ""               # HF directory (config.json + safetensors + tokenizer)
    config.model.name = ""               # or a grpo_jax.models named config, e.g. "tiny"
    config.model.rules = "fsdp"          # sharding rule set for training
    config.model.dtype = "float32"       # compute dtype
    config.model.param_dtype = "float32"
    config.model.remat = False

    # The task: a grpo_jax.data builder and its knobs, the prompt format, the rewards.
    config.task = config_dict.ConfigDict()
    config.task.name = "gsm8k"
    config.task.knobs = config_dict.ConfigDict()   # passed to the builder's config class
    config.task.data_dir = "~/tensorflow_datasets"
    config.task.manual_dir = ""          # official files for gsm8k / math500
    config.task.chat_template = False    # format prompts with the tokenizer's chat template
    config.task.system_prompt = ""
    config.task.eval_split = "test"

    # Registered grpo_jax.rewards as (name, weight) pairs: summed with the weights, or
    # kept as [B, K] columns when objective.advantage.estimator is "gdpo".
    config.reward = config_dict.ConfigDict()
    config.reward.specs = (("gsm8k", 1.0),)
    config.reward.correct = "gsm8k"      # the reward whose value 1 means "correct" (accuracy)
    config.reward.timeout_s = 10.0       # per row, for graders that run in the process pool

    # Rollouts: P prompts x G completions, a prompt's G rows consecutive (docs/design.md).
    config.rollout = config_dict.ConfigDict()
    config.rollout.prompts_per_batch = 64
    config.rollout.max_new_tokens = 1024
    config.rollout.temperature = 1.0
    config.rollout.top_p = 1.0
    config.rollout.rules = "sampling"    # weights' sharding rule set while sampling

    config.train = config_dict.ConfigDict()
    config.train.steps = 200
    config.train.epochs = 1              # mu: passes over each rollout batch
    config.train.minibatches = 1         # optimizer steps per epoch
    config.train.micro_batches = 1       # gradient accumulation per optimizer step
    config.train.behaviour_logp = "recompute"   # or "sampler" (corrected by objective.importance)
    config.train.eval_every = 50
    config.train.checkpoint_every = 25
    config.train.keep_checkpoints = 3
    config.train.export = True           # save_pretrained(workdir/export) at the end

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
    config.eval.samples = 4              # k for mean@k / pass@k at rollout.temperature

    # DAPO dynamic sampling: keep only groups whose rewards differ, drawing more prompt
    # batches until the train batch is full, up to max_gen_batches.
    config.filtering = config_dict.ConfigDict()
    config.filtering.dynamic_sampling = False
    config.filtering.max_gen_batches = 3

    config.objective = _objective()
    config.rollout.group_size = config.objective.get_ref("group_size")
    config.objective.overlong.max_len = config.rollout.get_ref("max_new_tokens")

    if arg.runlocal:
        _runlocal(config)
    return config


def _runlocal(config):
    """The tiny CPU setting: a 0.6M-parameter model on 3-digit addition, minutes per run."""
    config.model.name = "tiny"
    config.task.name = "arithmetic"
    config.task.knobs = config_dict.ConfigDict(dict(
        digits=3, ops=("+",), scratchpad=True, teacher_fraction=0.5, forget_carry_p=1.0,
        num_train=20_000, num_test=500))
    config.task.data_dir = "~/tensorflow_datasets/grpo_jax_runlocal"
    config.reward.specs = (("integer_answer", 1.0),)
    config.reward.correct = "integer_answer"
    config.rollout.prompts_per_batch = 16
    config.rollout.max_new_tokens = 40
    config.objective.group_size = 4
    config.train.steps = 20
    config.train.eval_every = 10
    config.train.checkpoint_every = 10
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 5
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
    """The `objective` section that `grpo_jax.objectives.policy_objective` reads."""
    obj = config_dict.ConfigDict()
    obj.group_size = 8

    # Advantage estimator: "group" (GRPO, Dr. GRPO), "rloo", "reinforce_pp", "gdpo".
    obj.advantage = config_dict.ConfigDict()
    obj.advantage.estimator = "group"
    obj.advantage.scale = "group"        # group: divide by group std; batch; none (Dr. GRPO)
    obj.advantage.ddof = 0               # 0 = population std (the seed); 1 = TRL/verl
    obj.advantage.eps = 1e-6
    obj.advantage.gamma = 1.0            # reinforce_pp discount
    obj.advantage.baseline = False       # reinforce_pp: subtract the group mean first
    obj.advantage.reward_weights = ()    # gdpo: one weight per reward column; () = all 1

    # Per-token policy loss: "ppo_clip", "gspo", "cispo", "sapo".
    obj.loss = config_dict.ConfigDict()
    obj.loss.kind = "ppo_clip"
    obj.loss.eps_low = 0.2
    obj.loss.eps_high = 0.2
    obj.loss.dual_clip = config_dict.placeholder(float)   # None = off; else c > 1
    obj.loss.tau_pos = 1.0               # sapo gate temperature, A > 0
    obj.loss.tau_neg = 1.05              # sapo gate temperature, A <= 0

    obj.aggregation = config_dict.ConfigDict()
    obj.aggregation.mode = "token-mean"
    obj.aggregation.norm_len = config_dict.placeholder(int)  # seq-mean-token-sum-norm; None = T

    obj.kl = config_dict.ConfigDict()
    obj.kl.beta = 0.0                    # > 0 loads a frozen reference model
    obj.kl.kind = "k3"
    obj.kl.in_reward = False             # reinforce_pp: fold -beta*KL into token rewards

    obj.entropy_coef = 0.0

    # Overlong handling: "none", "mask" (drop truncated completions from the loss),
    # "penalty" (DAPO's soft penalty over the last cache_len tokens before max_len).
    obj.overlong = config_dict.ConfigDict()
    obj.overlong.mode = "none"
    obj.overlong.max_len = 0             # tied to rollout.max_new_tokens in get_config
    obj.overlong.cache_len = 0

    # Sampler/trainer mismatch correction (truncated importance sampling).
    obj.importance = config_dict.ConfigDict()
    obj.importance.enabled = False
    obj.importance.level = "token"
    obj.importance.cap = 2.0
    obj.importance.mode = "truncate"
    return obj
