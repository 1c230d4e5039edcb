#!/usr/bin/env bash
# Runs every entry of the get_sweep() of the recipe in $CONFIG through run.sh, each in
# its own workdir $WORKDIR/NAME (NAME from tpu_scripts/sweep_runs.py, e.g.
# 00_eps_high-0.2_mode-token-mean) with the entry's fields added to EXTRA_ARGS.
# Entries run one after another on a pod; with several pods in TPU_NAMES they are dealt
# out in turn and the pods run side by side. A failed entry does not stop the others:
# the script ends non-zero naming it, and re-running resumes every workdir.
# On one machine's CPUs, `python -m grpo_jax.sweep` runs the same entries (same workdir
# names and flags, from grpo_jax/sweep.py) with several seeds, skipping finished runs,
# and `python -m grpo_jax.report` turns either's runs into a table and plots: each entry's
# workdir here gets its sweep_run.json first, so `python -m grpo_jax.report $WORKDIR`
# reads the bucket (add --collect_into DIR for a local copy of the small files).
#
# Required: ZONE PROJECT CONFIG WORKDIR, and TPU_NAME or TPU_NAMES ("pod-a pod-b")
# Optional: SWEEP_RUNS, the entry indices to run ("0 2"; default all); PYTHON, a local
#   Python with ml_collections to expand the sweep (default python3); run.sh's variables.
# Usage: tpu_scripts/sweep.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars ZONE PROJECT CONFIG WORKDIR
TPU_NAMES=${TPU_NAMES:-${TPU_NAME:-}}
[[ -n $TPU_NAMES ]] || die "set TPU_NAME (one pod) or TPU_NAMES (several, space-separated)"
read -ra pods <<<"$TPU_NAMES"

listing=$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
  "${PYTHON:-python3}" tpu_scripts/sweep_runs.py "$CONFIG")
mapfile -t runs <<<"$listing"
selected=()
for index in "${!runs[@]}"; do
  if [[ -z ${SWEEP_RUNS:-} || " $SWEEP_RUNS " == *" $index "* ]]; then selected+=("$index"); fi
done
((${#selected[@]})) || die "SWEEP_RUNS='${SWEEP_RUNS:-}' selects none of the ${#runs[@]} entries (0 to $((${#runs[@]} - 1)))"

# Each selected entry's sweep_run.json into its workdir (a real run only), so that
# `python -m grpo_jax.report $WORKDIR` reads the sweep where the pods leave it.
if ((!DRY_RUN)); then
  (cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "${PYTHON:-python3}" tpu_scripts/sweep_runs.py "$CONFIG" --record_into "$WORKDIR" \
    --entries "${selected[*]}" --machine "Cloud TPU ${ACCELERATOR_TYPE:-pod}: ${pods[*]}") ||
    die "could not write the sweep's records into $WORKDIR"
fi

# Runs, on pod number $1, the selected entries dealt to it; fails if any of them failed.
run_entries_on_pod() {
  local pod=${pods[$1]} position index name failed=0
  for position in "${!selected[@]}"; do
    ((position % ${#pods[@]} == $1)) || continue
    index=${selected[$position]}
    name=${runs[$index]%%$'\t'*}
    log "sweep entry $name on $pod"
    if ! TPU_NAME=$pod WORKDIR="$WORKDIR/$name" \
      EXTRA_ARGS="${EXTRA_ARGS:+$EXTRA_ARGS }${runs[$index]#*$'\t'}" \
      "$SCRIPT_DIR/run.sh" "${PASS_ON[@]}"; then
      log "sweep entry $name failed on $pod"
      failed=1
    fi
  done
  return "$failed"
}

status=0
if ((DRY_RUN)); then
  for pod_number in "${!pods[@]}"; do run_entries_on_pod "$pod_number" || status=1; done
else
  jobs_by_pod=()
  for pod_number in "${!pods[@]}"; do
    run_entries_on_pod "$pod_number" &
    jobs_by_pod+=("$!")
  done
  for job in "${jobs_by_pod[@]}"; do wait "$job" || status=1; done
fi
((status == 0)) || die "some sweep entries failed (see above); re-running resumes them"
