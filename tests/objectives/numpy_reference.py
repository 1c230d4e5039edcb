"""Independent float64 numpy references for `grpo_jax.objectives`.

Written from docs/semantics.md (the definitions of every objective) and, where
that is silent, from the conventions the public docstrings state. Nothing here imports
or calls the code under test. Plain per-row / per-group / per-token Python loops on
purpose: each function should be readable as the formula it checks.

Conventions shared by the policy losses:

- r = exp(clip(logp - old_logp, -20, 20)) (docs/semantics.md, "Batch layout").
- Every per-token output is 0 at masked positions, and so is every gradient.
- Each loss reference returns `(loss, grad, diagnostics)`, where `grad` is the
  analytic d(sum_t L_t)/d logp_t, per token.
"""

import math

import numpy as np

CLAMP = 20.0


def f64(x):
  return np.array(x, dtype=np.float64)


def _sigmoid(x):
  return 1.0 / (1.0 + math.exp(-x))


def _mean(xs):
  return sum(xs) / len(xs)


def _std(xs, ddof):
  m = _mean(xs)
  return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - ddof))


def _adv_at(adv, b, t):
  """Advantage of token (b, t): adv is [B] (per sequence) or [B, T] (per token)."""
  return adv[b] if adv.ndim == 1 else adv[b, t]


def _valid_ts(mask_row):
  return [t for t in range(len(mask_row)) if mask_row[t] > 0]


def _clamped_diff(a, b):
  """a - b clamped to [-20, 20], and d(clamped)/da (0 where the clamp is active)."""
  d = a - b
  if d > CLAMP:
    return CLAMP, 0.0
  if d < -CLAMP:
    return -CLAMP, 0.0
  return d, 1.0


def _kl_old(d):
  """r - 1 - log r for r = exp(d), d = logp - old_logp: KL(pi_old || pi) from pi_old's samples."""
  return math.expm1(d) - d


# --------------------------------------------------------------------------- advantages


def group_advantages(rewards, group_size, *, scale="group", ddof=0, eps=1e-6):
  r = f64(rewards)
  out = np.zeros_like(r)
  batch_std = _std(list(r), ddof)
  for start in range(0, len(r), group_size):
    group = list(r[start:start + group_size])
    if all(x == group[0] for x in group):
      continue  # a group of equal rewards gets exactly 0
    mean = _mean(group)
    for i, x in enumerate(group):
      a = x - mean
      if scale == "group":
        a /= _std(group, ddof) + eps
      elif scale == "batch":
        a /= batch_std + eps
      elif scale != "none":
        raise ValueError(scale)
      out[start + i] = a
  return out


def rloo_advantages(rewards, group_size):
  r = f64(rewards)
  out = np.zeros_like(r)
  for start in range(0, len(r), group_size):
    group = list(r[start:start + group_size])
    for i, x in enumerate(group):
      others = [y for j, y in enumerate(group) if j != i]
      out[start + i] = x - sum(others) / len(others)
  return out


def masked_whiten(x, mask, *, shift_mean=True, eps=1e-8):
  x = f64(x)
  mask = f64(mask)
  flat_x, flat_m = x.reshape(-1), mask.reshape(-1)
  vals = [flat_x[k] for k in range(flat_x.size) if flat_m[k] > 0]
  n = len(vals)
  mean = sum(vals) / n
  var = sum((v - mean) ** 2 for v in vals) / (n - 1)  # unbiased
  out = np.zeros_like(flat_x)
  for k in range(flat_x.size):
    if flat_m[k] > 0:
      out[k] = (flat_x[k] - mean) / math.sqrt(var + eps)
      if not shift_mean:
        out[k] += mean
  return out.reshape(x.shape)


def discounted_returns(token_rewards, mask, gamma):
  """G_t = R_t + gamma * G_{next valid t}, over the valid tokens of each row."""
  token_rewards, mask = f64(token_rewards), f64(mask)
  out = np.zeros_like(token_rewards)
  for b in range(mask.shape[0]):
    running = 0.0
    for t in reversed(_valid_ts(mask[b])):
      running = token_rewards[b, t] + gamma * running
      out[b, t] = running
  return out


def reinforce_pp_advantages(rewards, mask, *, gamma=1.0, group_size=None,
                            token_rewards=None, eps=1e-8):
  r = f64(rewards)
  mask = f64(mask)
  if group_size is not None:
    base = r.copy()
    for start in range(0, len(r), group_size):
      g_mean = _mean(list(base[start:start + group_size]))
      for i in range(start, start + group_size):
        r[i] = base[i] - g_mean
  per_token = np.zeros_like(mask)
  for b in range(mask.shape[0]):
    valid = _valid_ts(mask[b])
    for t in valid:
      if token_rewards is not None:
        per_token[b, t] += float(token_rewards[b][t])
    if valid:
      per_token[b, valid[-1]] += r[b]  # the scalar reward sits on the last valid token
  returns = discounted_returns(per_token, mask, gamma)
  return masked_whiten(returns, mask, shift_mean=True, eps=eps)


def gdpo_advantages(rewards, group_size, *, weights=None, eps=1e-6):
  r = f64(rewards)
  num_rows, num_rewards = r.shape
  w = np.ones(num_rewards) if weights is None else f64(weights)
  summed = np.zeros(num_rows)
  for k in range(num_rewards):
    for start in range(0, num_rows, group_size):
      group = list(r[start:start + group_size, k])
      mean, std = _mean(group), _std(group, 0)
      for i, x in enumerate(group):
        summed[start + i] += w[k] * (x - mean) / (std + eps)
  mean, std = _mean(list(summed)), _std(list(summed), 0)
  return np.array([(s - mean) / (std + eps) for s in summed])


def gae(token_rewards, values, mask, *, gamma, lam):
  rew, val, mask = f64(token_rewards), f64(values), f64(mask)
  num_rows = mask.shape[0]
  lams = np.broadcast_to(f64(lam), (num_rows,))
  adv = np.zeros_like(val)
  ret = np.zeros_like(val)
  for b in range(num_rows):
    next_value, next_adv = 0.0, 0.0  # V after the last valid token is 0
    for t in reversed(_valid_ts(mask[b])):
      delta = rew[b, t] + gamma * next_value - val[b, t]
      a = delta + gamma * lams[b] * next_adv
      adv[b, t] = a
      ret[b, t] = a + val[b, t]
      next_value, next_adv = val[b, t], a
  return adv, ret


def length_adaptive_lambda(lengths, *, alpha=0.05):
  out = []
  for length in f64(lengths):
    lam = 1.0 - 1.0 / (alpha * length) if length > 0 else -math.inf
    out.append(max(lam, 0.0))  # clamped to [0, 1)
  return np.array(out)


# --------------------------------------------------------------------- shaping, filtering


def overlong_penalty(lengths, *, max_len, cache_len):
  out = []
  for length in f64(lengths):
    if length <= max_len - cache_len:
      out.append(0.0)
    elif length <= max_len:
      out.append(((max_len - cache_len) - length) / cache_len)
    else:
      out.append(-1.0)
  return np.array(out)


def truncated_mask(mask, truncated):
  mask = f64(mask)
  out = mask.copy()
  for b in range(mask.shape[0]):
    if truncated[b]:
      out[b, :] = 0.0
  return out


def group_has_signal(rewards, group_size):
  r = f64(rewards)
  out = []
  for start in range(0, len(r), group_size):
    group = list(r[start:start + group_size])
    out.append(not all(x == group[0] for x in group))
  return np.array(out, dtype=bool)


def importance_weights(old_logp, behaviour_logp, mask, *, level="token", cap=2.0,
                       mode="truncate"):
  old, beh, mask = f64(old_logp), f64(behaviour_logp), f64(mask)
  raw = np.zeros_like(old)
  for b in range(mask.shape[0]):
    valid = _valid_ts(mask[b])
    if level == "token":
      for t in valid:
        raw[b, t] = math.exp(old[b, t] - beh[b, t])
    elif level == "sequence":
      prod = 1.0
      for t in valid:
        prod *= math.exp(old[b, t] - beh[b, t])
      for t in valid:
        raw[b, t] = prod
    else:
      raise ValueError(level)
  out = np.zeros_like(raw)
  for b in range(mask.shape[0]):
    for t in _valid_ts(mask[b]):
      w = raw[b, t]
      if mode == "truncate":
        out[b, t] = min(w, cap)
      elif mode == "mask":
        out[b, t] = w if 1.0 / cap <= w <= cap else 0.0
      else:
        raise ValueError(mode)
  return out


# ----------------------------------------------------------------------- policy losses


def _empty_diagnostics(shape, *names):
  return {name: np.zeros(shape) for name in names}


def ppo_clip_loss(logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=0.2, dual_clip=None):
  """Returns (loss, d sum(loss)/d logp, diagnostics)."""
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  diag = _empty_diagnostics(logp.shape, "ratio", "kl_old", "clip_low", "clip_high", "clip_dual")
  for b in range(mask.shape[0]):
    for t in _valid_ts(mask[b]):
      d, dd = _clamped_diff(logp[b, t], old[b, t])
      r = math.exp(d)
      a = _adv_at(adv, b, t)
      unclipped = r * a
      clipped = min(max(r, 1.0 - eps_low), 1.0 + eps_high) * a
      if unclipped <= clipped:
        value, g = -unclipped, -a * r * dd
      else:  # the clipped term is selected: r is outside the range, the term is constant
        value, g = -clipped, 0.0
        if r < 1.0 - eps_low:
          diag["clip_low"][b, t] = 1.0
        else:
          diag["clip_high"][b, t] = 1.0
      if dual_clip is not None and a < 0 and value > -dual_clip * a:
        value, g = -dual_clip * a, 0.0
        diag["clip_dual"][b, t] = 1.0
      loss[b, t], grad[b, t] = value, g
      diag["ratio"][b, t] = r
      diag["kl_old"][b, t] = _kl_old(d)
  return loss, grad, diag


def pg_loss(logp, old_logp, adv, mask):
  """L = -r A; d L / d logp = -r A (0 where the log-ratio clamp is active)."""
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  diag = _empty_diagnostics(logp.shape, "ratio", "kl_old")
  for b in range(mask.shape[0]):
    for t in _valid_ts(mask[b]):
      d, dd = _clamped_diff(logp[b, t], old[b, t])
      r = math.exp(d)
      a = _adv_at(adv, b, t)
      loss[b, t], grad[b, t] = -r * a, -r * a * dd
      diag["ratio"][b, t] = r
      diag["kl_old"][b, t] = _kl_old(d)
  return loss, grad, diag


def gspo_loss(logp, old_logp, adv, mask, *, eps_low=3e-4, eps_high=4e-4):
  """Returns (loss, d sum(loss)/d logp, diagnostics) for the token form.

  In the token form log s_{i,t} = sg(log s_i) + logp_t - sg(logp_t), so
  d L_{i,t} / d logp_t = -A s_i where the sequence ratio is unclipped (else 0), and
  L_{i,t} does not depend on the other tokens. Dividing by n_i (seq-mean-token-mean)
  gives GSPO's sequence gradient d/d logp_t [-min(s_i A, clip(s_i) A)] = -A s_i / n_i.
  """
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  diag = _empty_diagnostics(logp.shape, "ratio", "kl_old", "clip_low", "clip_high")
  for b in range(mask.shape[0]):
    valid = _valid_ts(mask[b])
    if not valid:
      continue
    log_s = sum(logp[b, t] - old[b, t] for t in valid) / len(valid)
    s = math.exp(log_s)
    for t in valid:
      a = _adv_at(adv, b, t)
      unclipped = s * a
      clipped = min(max(s, 1.0 - eps_low), 1.0 + eps_high) * a
      if unclipped <= clipped:
        loss[b, t], grad[b, t] = -unclipped, -a * s
      else:
        loss[b, t], grad[b, t] = -clipped, 0.0
        diag["clip_low" if s < 1.0 - eps_low else "clip_high"][b, t] = 1.0
      diag["ratio"][b, t] = s
      diag["kl_old"][b, t] = _kl_old(logp[b, t] - old[b, t])
  return loss, grad, diag


def cispo_loss(logp, old_logp, adv, mask, *, eps_low, eps_high):
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  diag = _empty_diagnostics(logp.shape, "ratio", "kl_old", "clip_low", "clip_high")
  for b in range(mask.shape[0]):
    for t in _valid_ts(mask[b]):
      d, _ = _clamped_diff(logp[b, t], old[b, t])
      r = math.exp(d)
      a = _adv_at(adv, b, t)
      weight = min(max(r, 1.0 - eps_low), 1.0 + eps_high)  # a constant (stop-gradient)
      loss[b, t] = -weight * a * logp[b, t]
      grad[b, t] = -weight * a
      diag["ratio"][b, t] = r
      diag["kl_old"][b, t] = _kl_old(d)
      diag["clip_low"][b, t] = float(r < 1.0 - eps_low)
      diag["clip_high"][b, t] = float(r > 1.0 + eps_high)
  return loss, grad, diag


def sapo_loss(logp, old_logp, adv, mask, *, tau_pos=1.0, tau_neg=1.05):
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  diag = _empty_diagnostics(logp.shape, "ratio", "kl_old", "gate_scale")
  for b in range(mask.shape[0]):
    for t in _valid_ts(mask[b]):
      d, dd = _clamped_diff(logp[b, t], old[b, t])
      r = math.exp(d)
      a = _adv_at(adv, b, t)
      tau = tau_pos if a > 0 else tau_neg
      sig = _sigmoid(tau * (r - 1.0))
      loss[b, t] = -sig * 4.0 / tau * a
      # f'(r) = 4 sig (1 - sig); dr/dlogp = r.
      gate_scale = 4.0 * sig * (1.0 - sig) * r * dd
      grad[b, t] = -a * gate_scale
      diag["ratio"][b, t] = r
      diag["kl_old"][b, t] = _kl_old(d)
      diag["gate_scale"][b, t] = gate_scale
  return loss, grad, diag


# ------------------------------------------------------------------------ KL and logits


def kl_penalty(logp, ref_logp, *, kind="k3", old_logp=None):
  return kl_penalty_and_grad(logp, ref_logp, kind=kind, old_logp=old_logp)[0]


def kl_penalty_and_grad(logp, ref_logp, *, kind="k3", old_logp=None):
  """Per-token estimate and its derivative d/d logp (ref and old log-probs held fixed)."""
  logp, ref = f64(logp), f64(ref_logp)
  out, grad = np.zeros_like(logp), np.zeros_like(logp)
  for idx in np.ndindex(logp.shape):
    d, dd = _clamped_diff(logp[idx], ref[idx])
    if kind == "k1":
      out[idx], grad[idx] = d, dd
    elif kind == "k2":
      out[idx], grad[idx] = d * d / 2.0, d * dd
    elif kind in ("k3", "k3_unbiased"):
      k3 = math.expm1(-d) + d  # exp(ref - logp) - (ref - logp) - 1
      dk3 = (1.0 - math.exp(-d)) * dd
      if kind == "k3":
        out[idx], grad[idx] = k3, dk3
      else:  # DeepSeek-V3.2: r k3 with r = pi/pi_old, differentiated through r as well
        e, de = _clamped_diff(logp[idx], float(f64(old_logp)[idx]))
        r = math.exp(e)
        out[idx], grad[idx] = r * k3, r * de * k3 + r * dk3
    else:
      raise ValueError(kind)
  return out, grad


def offpolicy_sequence_mask(logp, old_logp, adv, mask, *, delta):
  """M_i = 0 if A_i < 0 and mean_t log(pi_old / pi) > delta, else 1 (DeepSeek-V3.2)."""
  logp, old, adv, mask = f64(logp), f64(old_logp), f64(adv), f64(mask)
  out = np.ones(mask.shape[0])
  for b in range(mask.shape[0]):
    valid = _valid_ts(mask[b])
    if not valid:
      continue
    divergence = sum(old[b, t] - logp[b, t] for t in valid) / len(valid)
    a = adv[b] if adv.ndim == 1 else sum(adv[b, t] for t in valid) / len(valid)
    if a < 0 and divergence > delta:
      out[b] = 0.0
  return out


def _log_softmax(z):
  top = max(z)
  lse = top + math.log(sum(math.exp(v - top) for v in z))
  return [v - lse for v in z]


def entropy_from_logits(logits):
  z = f64(logits)
  out = np.zeros(z.shape[:-1])
  for idx in np.ndindex(out.shape):
    logq = _log_softmax(list(z[idx]))
    out[idx] = -sum(math.exp(lq) * lq for lq in logq)
  return out


def token_logprobs(logits, tokens, *, temperature=1.0):
  z = f64(logits)
  out = np.zeros(z.shape[:-1])
  for idx in np.ndindex(out.shape):
    logq = _log_softmax([v / float(temperature) for v in z[idx]])
    out[idx] = logq[int(tokens[idx])]
  return out


# ------------------------------------------------------------------------- aggregation


def aggregate(loss, mask, *, mode, num_tokens=None, num_seqs=None, norm_len=None):
  loss, mask = f64(loss), f64(mask)
  num_rows, length = mask.shape
  num_tokens = mask.sum() if num_tokens is None else float(num_tokens)
  num_seqs = num_rows if num_seqs is None else float(num_seqs)
  norm_len = length if norm_len is None else float(norm_len)
  total = 0.0
  for b in range(num_rows):
    row = sum(loss[b, t] * mask[b, t] for t in range(length))
    if mode == "seq-mean-token-mean":
      n_b = sum(mask[b])
      total += row / n_b if n_b > 0 else 0.0
    else:
      total += row
  if mode == "token-mean":
    return total / num_tokens if num_tokens > 0 else 0.0
  if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
    return total / num_seqs
  if mode == "seq-mean-token-sum-norm":
    return total / (num_seqs * norm_len)
  raise ValueError(mode)
