"""The embedded default: SFT warm start of a tiny model on 3-digit addition, then DAPO.

    python -m grpo_jax.main        # = --config configs/demo.py --workdir workdirs/demo

The task is the bundled procedural arithmetic (prompt ``478+256=``, answer
``8+6+0=14 7+5+1=13 4+2+1=7 #### 734``). The warm start learns from targets 60% of which
come from a teacher that forgets every carry, so the SFT policy writes carries only some
of the time: the right answer is among its samples but not yet its pick, which is what RL
can select. Then three held-out evaluations: after SFT, after DAPO, and after more SFT
for the same wall time as DAPO took (the control: is the gain RL's or just more training?).

Hardware: 2 CPU cores. Time and result: see the README's table (the command prints it).
"""

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, seed=0, runlocal=True)   # the demo is always runlocal
    config = config_lib.load_sibling(__file__, "dapo").get_config("runlocal=True")
    config.mode = "demo"
    config.seed = arg.seed
    # 60% of the SFT targets forget every carry: greedy decoding after SFT forgets them
    # too, while sampling still writes the carry often enough for RL to find it.
    config.task.knobs.teacher_fraction = 0.6
    config.model.sft_warm_start = False  # the demo's first stage is the warm start itself
    # DAPO's runlocal regime (4 updates per rollout batch, 48 tokens) on a larger batch:
    # 64 prompts x 8 answers. Dynamic sampling draws at most 3 batches and then pads, to
    # bound the demo's time once the policy solves most prompts.
    config.rollout.prompts_per_batch = 64
    config.objective.group_size = 8
    config.filtering.max_gen_batches = 3
    config.filtering.short_batch = "pad"
    config.train.steps = 20
    config.train.eval_every = 10**9      # the table evaluates every stage once, at the end
    config.train.checkpoint_every = 5
    config.sft.steps = 600
    config.sft.batch_size = 32
    config.sft.optimizer.learning_rate = 1e-3
    config.sft.eval_every = 10**9
    config.sft.checkpoint_every = 200
    config.eval.num_prompts = 500
    return config
