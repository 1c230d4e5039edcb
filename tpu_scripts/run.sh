#!/usr/bin/env bash
# Runs the trainer on every worker of $TPU_NAME at once, and waits for it to end:
#   python -m grpo_jax.main --config=$CONFIG --workdir=$WORKDIR $DISTRIBUTED_FLAG $EXTRA_ARGS
# Every worker runs the same command; jax.distributed.initialize() finds the other
# workers of a TPU pod by itself. Re-running it resumes from the workdir's last
# checkpoint, so WORKDIR must be shared by the workers (gs://...).
#
# Required: TPU_NAME ZONE PROJECT CONFIG WORKDIR
# Optional: EXTRA_ARGS, more trainer flags ("--config.train.steps=100"), as shell words;
#   DISTRIBUTED_FLAG, the trainer's switch for jax.distributed (default
#   --config.distributed.enabled=True; set it empty to leave it out).
# Usage: tpu_scripts/run.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT CONFIG WORKDIR

[[ $WORKDIR == gs://* ]] || log "warning: WORKDIR=$WORKDIR is not on GCS: each worker writes its own copy"
trainer=(
  "\"\$HOME/$VENV_DIR/bin/python\"" -m grpo_jax.main
  "--config=$(quote "$CONFIG")" "--workdir=$(quote "$WORKDIR")"
)
distributed=${DISTRIBUTED_FLAG---config.distributed.enabled=True}
[[ -z $distributed ]] || trainer+=("$distributed")
[[ -z ${EXTRA_ARGS:-} ]] || trainer+=("$EXTRA_ARGS")
on_workers "cd \"\$HOME/$REMOTE_DIR\" && ${trainer[*]}"
