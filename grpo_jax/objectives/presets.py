"""Each method's objective as a function call, no config file needed.

    from grpo_jax.objectives import presets
    objective = presets.dapo(group_size=16)                 # DAPO's clip-higher, token mean
    loss, metrics = objective(logp, batch)                  # batch: see policy_objective
    objective = presets.gspo(group_size=8, eps_high=5e-4)   # a paper default changed
    objective = presets.grpo(group_size=8, kl_beta=0.0, importance=True)   # any field

Every preset returns a `PolicyObjective` whose hyper-parameters are frozen
(``objective.spec``, an `ObjectiveSpec`) and the same objective the repository's recipe
of that name builds: the recipes in configs/ are made by calling these functions.
``group_size`` (G, the completions per prompt) is required: it fixes the grouping of the
rows, so it is stated at the call, never inherited from a recipe, and a batch G does not
divide is an error. Any other `ObjectiveSpec` field can be given as a keyword; an unknown
keyword is a TypeError naming the closest field, and a field the objective does not read
(``presets.sapo(group_size=4, eps_high=0.3)``) a ValueError naming the settings that do.

What a recipe holds beyond the objective (dynamic sampling, DAPO's soft overlong
penalty, which is a reward, the rollout regime, the learning rate) is the trainer's, in
configs/<method>.py; each preset's docstring says what that is.
"""

from grpo_jax.objectives._compose import PolicyObjective, policy_objective
from grpo_jax.objectives._spec import ObjectiveSpec, check_keywords, check_read

__all__ = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "rloo", "reinforce_pp", "gdpo",
           "ppo", "vapo", "gmpo", "dppo", "m2po", "clip_cov", "kl_cov", "distill", "luspo",
           "vespo"]


def _build(preset, fields, changes, reward_weights=None) -> PolicyObjective:
    check_keywords(changes, f"presets.{preset}")
    spec = ObjectiveSpec(**{**fields, **changes})
    check_read(spec, changes, f"presets.{preset}")
    return policy_objective(spec, reward_weights=reward_weights)


def grpo(*, group_size, eps_low=0.2, eps_high=0.2, kl_beta=0.001, kl_kind="k3",
         **changes) -> PolicyObjective:
    """GRPO: group-normalised advantages, PPO clip, a per-answer mean, KL to a reference.

    Papers: Shao et al., DeepSeekMath (arXiv:2402.03300), sec. 4.1, eq. 3 (the objective,
    k3 estimator); Guo et al., DeepSeek-R1 (arXiv:2501.12948 v2, sec. 2.1: beta = 0.001).
    The recipe adds R1's reset of the reference to the policy every 400 steps
    (``train.ref_reset_every``).
    """
    return _build("grpo", dict(group_size=group_size, advantage_scale="group",
                               aggregation="seq-mean-token-mean", eps_low=eps_low,
                               eps_high=eps_high, kl_beta=kl_beta, kl_kind=kl_kind), changes)


def dr_grpo(*, group_size, norm_len, eps_low=0.2, eps_high=0.2, **changes) -> PolicyObjective:
    """Dr. GRPO: no std division, sums over tokens divided by a constant, no KL.

    `norm_len` is the constant: the generation budget (max new tokens), so an answer's
    weight does not depend on its length.
    Paper: Liu et al., Understanding R1-Zero-Like Training (arXiv:2503.20783), sec. 3.1.
    """
    return _build("dr_grpo", dict(group_size=group_size, advantage_scale="none",
                                  aggregation="seq-mean-token-sum-norm", norm_len=norm_len,
                                  eps_low=eps_low, eps_high=eps_high), changes)


def dapo(*, group_size, eps_low=0.2, eps_high=0.28, **changes) -> PolicyObjective:
    """DAPO: clip-higher and the token-level mean, no KL.

    The recipe adds dynamic sampling (``filtering.dynamic_sampling``) and the soft
    overlong penalty as a reward (``("overlong", 1.0, {...})`` in ``reward.specs``); with
    ``overlong="mask"`` truncated answers leave the loss instead.
    Paper: Yu et al., DAPO (arXiv:2503.14476), eq. 8-10 (clip 0.2 / 0.28).
    """
    return _build("dapo", dict(group_size=group_size, advantage_scale="group",
                               aggregation="token-mean", eps_low=eps_low, eps_high=eps_high),
                  changes)


def gspo(*, group_size, eps_low=3e-4, eps_high=4e-4, **changes) -> PolicyObjective:
    """GSPO: one clipped, length-normalised sequence ratio per answer.

    Paper: Zheng et al., Group Sequence Policy Optimization (arXiv:2507.18071), eq. 5-7;
    clip 3e-4 / 4e-4 (sec. 5.1).
    """
    return _build("gspo", dict(group_size=group_size, policy_loss="gspo",
                               aggregation="seq-mean-token-mean", eps_low=eps_low,
                               eps_high=eps_high), changes)


def cispo(*, group_size, eps_low=1.0, eps_high=0.28, trl_epsilon_high=None,
          **changes) -> PolicyObjective:
    """CISPO: the importance weight clipped (upper bound only), never the gradient.

    eps_low = 1 removes the lower bound as MiniMax-M1 does. The weight's cap is
    1 + eps_high (relative, as the paper's epsilon); ``trl_epsilon_high=c`` takes TRL's
    absolute cap c instead (TRL's ``epsilon_high`` with ``loss_type="cispo"``: c = 5.0 is
    eps_high = 4.0 here; passing 5.0 as eps_high would cap at 6). The recipe adds DAPO's
    dynamic sampling and soft overlong reward. Paper: MiniMax, MiniMax-M1
    (arXiv:2506.13585), sec. 3.1, eq. 4-5.
    """
    if trl_epsilon_high is not None:
        if eps_high != 0.28:
            raise ValueError("presets.cispo: give eps_high (relative: the cap is 1 + eps_high) "
                             "or trl_epsilon_high (TRL's absolute cap), not both")
        if not trl_epsilon_high >= 1.0:
            raise ValueError(f"presets.cispo: trl_epsilon_high is TRL's absolute cap on the "
                             f"weight pi_theta / pi_old and must be >= 1, got {trl_epsilon_high}")
        eps_high = float(trl_epsilon_high) - 1.0
    return _build("cispo", dict(group_size=group_size, policy_loss="cispo",
                                aggregation="token-mean", eps_low=eps_low, eps_high=eps_high),
                  changes)


def sapo(*, group_size, tau_pos=1.0, tau_neg=1.05, **changes) -> PolicyObjective:
    """SAPO: a sigmoid gate on the ratio instead of a hard clip, per-answer mean.

    Paper: Gao et al., Soft Adaptive Policy Optimization (arXiv:2511.20347), eq. 6-8
    (tau_pos = 1.0, tau_neg = 1.05).
    """
    return _build("sapo", dict(group_size=group_size, policy_loss="sapo",
                               aggregation="seq-mean-token-mean", tau_pos=tau_pos,
                               tau_neg=tau_neg), changes)


def rloo(*, group_size, **changes) -> PolicyObjective:
    """RLOO: leave-one-out baselines, the plain policy gradient (no clip), token mean.

    Paper: Ahmadian et al., Back to Basics (arXiv:2402.14740), sec. 3.2 (RLOO, eq. 6).
    """
    return _build("rloo", dict(group_size=group_size, estimator="rloo", policy_loss="pg",
                               aggregation="token-mean"), changes)


def reinforce_pp(*, group_size, baseline=False, kl_in_reward=False, kl_beta=None,
                 **changes) -> PolicyObjective:
    """REINFORCE++: returns whitened over the batch, PPO clip, token mean.

    ``baseline=True`` subtracts the group mean first (REINFORCE++-baseline);
    ``kl_in_reward=True`` folds -beta KL (k1) into the token rewards with beta = 0.01
    unless `kl_beta` says otherwise. Paper: Hu, REINFORCE++ (arXiv:2501.03262), sec. 3.
    """
    if kl_beta is None:
        kl_beta = 0.01 if kl_in_reward else 0.0
    return _build("reinforce_pp", dict(group_size=group_size, estimator="reinforce_pp",
                                       baseline=baseline, aggregation="token-mean",
                                       kl_in_reward=kl_in_reward, kl_beta=kl_beta,
                                       kl_kind="k1"), changes)


def gdpo(*, group_size, reward_weights=None, eps_low=0.2, eps_high=0.28,
         **changes) -> PolicyObjective:
    """GDPO: each reward column normalised within its group, then weighted and summed.

    ``batch["rewards"]`` is `[B, K]`, one column per reward; `reward_weights` one weight
    per column (None: all 1). Paper: Liu et al., GDPO (arXiv:2601.05242), eq. 4-7.
    """
    return _build("gdpo", dict(group_size=group_size, estimator="gdpo",
                               aggregation="token-mean", eps_low=eps_low, eps_high=eps_high),
                  changes, reward_weights=reward_weights)


def ppo(*, group_size=1, lam=0.95, gamma=1.0, eps_low=0.2, eps_high=0.2,
        **changes) -> PolicyObjective:
    """PPO with a critic: GAE over ``batch["values"]``, whitened, PPO clip.

    Paper: Schulman et al., PPO (arXiv:1707.06347), eq. 7; GAE (arXiv:1506.02438). The
    critic (its value loss and optimizer) is the trainer's (``critic`` section).
    """
    return _build("ppo", dict(group_size=group_size, estimator="gae", gamma=gamma, lam=lam,
                              whiten=True, aggregation="seq-mean-token-mean",
                              eps_low=eps_low, eps_high=eps_high), changes)


def vapo(*, group_size, lam_alpha=0.05, eps_low=0.2, eps_high=0.28, positive_nll_weight=0.1,
         **changes) -> PolicyObjective:
    """VAPO: PPO with length-adaptive GAE, clip-higher, token mean, positive-example NLL.

    Paper: Yue et al., VAPO (arXiv:2504.05118), eq. 7 (alpha = 0.05), sec. 4 (clip
    0.2 / 0.28, mu = 0.1). The recipe adds the critic's decoupled lambda = 1 and its
    pre-training; it scales alpha with the generation budget when ``runlocal`` shrinks it.
    """
    return _build("vapo", dict(group_size=group_size, estimator="gae", gamma=1.0,
                               lam_alpha=lam_alpha, whiten=True, aggregation="token-mean",
                               eps_low=eps_low, eps_high=eps_high,
                               positive_nll_weight=positive_nll_weight), changes)


def gmpo(*, group_size, eps_low=0.4, eps_high=0.4, **changes) -> PolicyObjective:
    """GMPO: the geometric mean of token ratios, each clipped in log space, per answer.

    Paper: Zhao et al., Geometric-Mean Policy Optimization (arXiv:2507.20673): the clip
    range (e^-0.4, e^0.4) of the authors' scripts; group advantages, no KL.
    """
    return _build("gmpo", dict(group_size=group_size, policy_loss="gmpo",
                               aggregation="seq-mean-token-mean", eps_low=eps_low,
                               eps_high=eps_high), changes)


def dppo(*, group_size, divergence="binary_tv", delta_low=None, delta_high=None,
         ratio_cap=20.0, **changes) -> PolicyObjective:
    """DPPO: a trust region on the divergence between pi_theta and pi_old, not the ratio.

    A token leaves the update when its binary TV (0.15) or KL (0.05) has moved past the
    threshold in the direction its advantage pushes it; the importance weight is capped
    at 20. Token mean, group advantages, no KL. Paper: Qi et al., Rethinking the Trust
    Region in LLM Reinforcement Learning (arXiv:2602.04879), sec. 5.4 and App. F.
    """
    return _build("dppo", dict(group_size=group_size, policy_loss="dppo",
                               aggregation="token-mean", dppo_divergence=divergence,
                               dppo_delta_low=delta_low, dppo_delta_high=delta_high,
                               dppo_ratio_cap=ratio_cap), changes)


def m2po(*, group_size, tau=0.04, **changes) -> PolicyObjective:
    """M2PO: no ratio clip; the tokens with the largest squared log-ratio leave the loss
    until the rest's second moment is under tau.

    For stale rollouts: the ratio is against ``batch["behaviour_logp"]`` (the policy that
    sampled) when present. Token mean, group advantages. Paper: Zheng, Zhao & Chen,
    Prosperity before Collapse (arXiv:2510.01161), tau = 0.04.
    """
    return _build("m2po", dict(group_size=group_size, policy_loss="pg", aggregation="token-mean",
                               m2po=True, m2po_tau=tau), changes)


def clip_cov(*, group_size, clip_fraction=2e-4, cov_low=1.0, cov_high=5.0, eps_low=1.0,
             eps_high=1.0, **changes) -> PolicyObjective:
    """Clip-Cov: PPO's loss with a random 2e-4 of the tokens whose log-prob/advantage
    covariance lies in (1, 5) left out, against entropy collapse.

    Needs ``batch["loss_seed"]`` ([B] ints, a fresh draw per step). Token mean. Paper:
    Cui et al., The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617); clip
    1 / 1 as the authors' scripts.
    """
    return _build("clip_cov", dict(group_size=group_size, policy_loss="clip_cov",
                                   aggregation="token-mean", clip_cov_fraction=clip_fraction,
                                   clip_cov_low=cov_low, clip_cov_high=cov_high,
                                   eps_low=eps_low, eps_high=eps_high), changes)


def kl_cov(*, group_size, kl_fraction=2e-3, kl_coef=1.0, **changes) -> PolicyObjective:
    """KL-Cov: the unclipped policy gradient plus |log r| on the 2e-3 of the tokens with
    the largest log-prob/advantage covariance, against entropy collapse.

    Token mean. Paper: Cui et al. (arXiv:2505.22617); k = 2e-3 as the authors' 7B recipe.
    """
    return _build("kl_cov", dict(group_size=group_size, policy_loss="kl_cov",
                                 aggregation="token-mean", kl_cov_fraction=kl_fraction,
                                 kl_cov_coef=kl_coef), changes)


def distill(*, group_size=1, **changes) -> PolicyObjective:
    """On-policy distillation: the student samples, a teacher's log-probs of the sampled
    tokens give each token the reward -(log pi_old - log pi_teacher), the reverse KL.

    The batch carries ``teacher_logp`` (`[B, T]`, the same tokenizer) instead of rewards;
    the per-token advantages are teacher_logp - old_logp, the loss the plain
    importance-weighted policy gradient, token mean: on-policy (old_logp = logp) its value
    is the token mean of the reverse-KL estimate and its gradient that of
    `reverse_kl_distill_loss`. No groups are needed (group_size 1 unless given).
    Paper: Agarwal et al., On-Policy Distillation of Language Models (GKD,
    arXiv:2306.13649), sec. 3.1, with the reverse KL.
    """
    return _build("distill", dict(group_size=group_size, estimator="reverse_kl",
                                  policy_loss="pg", aggregation="token-mean"), changes)


def luspo(*, group_size, eps_low=3e-4, eps_high=4e-4, **changes) -> PolicyObjective:
    """LUSPO: GSPO's sequence-ratio loss with each answer's term scaled by its length.

    The per-answer loss of GSPO times |y_i|, averaged over answers (``seq-mean-token-sum``
    of GSPO's per-token loss): long answers are no longer weighted down, the length bias
    of GSPO the paper removes. The clip range defaults to GSPO's preset (3e-4, 4e-4);
    TRL's loss_type="luspo" with importance_sampling_level="sequence" is this loss with
    TRL's epsilon range.
    Paper: Liu, Yin, Shi, Yang, Zeng, Qiu, Length-Unbiased Sequence Policy Optimization
    (arXiv:2602.05261), the LUSPO objective.
    """
    return _build("luspo", dict(group_size=group_size, policy_loss="luspo",
                                aggregation="seq-mean-token-sum", eps_low=eps_low,
                                eps_high=eps_high), changes)


def vespo(*, group_size, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0,
          **changes) -> PolicyObjective:
    """VESPO: the policy gradient softly weighted by a Gamma kernel of the sequence ratio.

    `vespo_loss` per token (phi(w) = e^lambda w^k e^(-lambda w) of the product of the
    token ratios, by the sign of A), token mean as TRL's loss_type="vespo"; the kernel's
    parameters default to TRL's. No clip.
    Paper: Shen, Zhao, Cheng, Huang, Yu, VESPO (arXiv:2602.10693), the reshaping kernel.
    """
    return _build("vespo", dict(group_size=group_size, policy_loss="vespo",
                                aggregation="token-mean", vespo_k_pos=k_pos,
                                vespo_lambda_pos=lambda_pos, vespo_k_neg=k_neg,
                                vespo_lambda_neg=lambda_neg), changes)
