#!/usr/bin/env bash
# Keeps a run going on spot or queued capacity: checks the TPU, and when it is
# preempted, terminated, suspended or gone, deletes it, creates it again, sets it up and
# starts the job again, which resumes from the workdir's last checkpoint. Stops when the
# job succeeds, or after MAX_FAILURES failures in a row on a healthy TPU. A job stopped by
# SIGTERM after saving its checkpoint (the trainer's exit status 75) is not a failure: it
# is started again (after recreating the TPU if the state says it was preempted).
#
# A dry run prints one round: the state query, then (with the state PREEMPTED, or
# TPU_STATE_OVERRIDE) the commands of delete.sh, create.sh, setup.sh, kill.sh and the job.
#
# Required: TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION REPO CONFIG WORKDIR
# Optional: JOB=run|sweep (default run); POLL_SECONDS (default 60); MAX_FAILURES
#   (default 3); TPU_STATE_OVERRIDE, a state to use instead of asking gcloud; and the
#   variables of the scripts it calls (CAPACITY, QUEUED, ...).
# Usage: tpu_scripts/babysit.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION REPO CONFIG WORKDIR
case ${JOB:=run} in
  run | sweep) ;;
  *) die "JOB must be run or sweep, got '$JOB'" ;;
esac

step() { "$SCRIPT_DIR/$1.sh" "${PASS_ON[@]}"; }
export TPU_NAMES=$TPU_NAME # a babysat sweep runs on this pod only (split pods with SWEEP_RUNS)

recreate() {
  log "recreating $TPU_NAME (state $TPU_STATE)"
  if [[ $TPU_STATE != MISSING ]]; then step delete || return; fi
  step create && step setup
}

failures=0
while true; do
  query_state
  case $TPU_STATE in
    READY | ACTIVE) ;;
    PREEMPTED | TERMINATED | SUSPENDED | FAILED | MISSING)
      failures=0
      if ! recreate; then
        log "could not recreate $TPU_NAME; trying again in ${POLL_SECONDS:-60} s"
        sleep "${POLL_SECONDS:-60}"
        continue
      fi
      ;;
    *)
      log "waiting for $TPU_NAME to become ready"
      if ((DRY_RUN)); then exit 0; fi
      sleep "${POLL_SECONDS:-60}"
      continue
      ;;
  esac
  step kill || log "kill.sh failed; starting $JOB anyway"
  status=0
  step "$JOB" || status=$?
  if ((status == 0)); then
    log "$JOB finished"
    exit 0
  fi
  if ((status == 75)); then
    log "$JOB stopped by SIGTERM after saving its checkpoint; resuming it"
    failures=0
    sleep "${POLL_SECONDS:-60}"
    continue
  fi
  failures=$((failures + 1))
  if ((failures >= ${MAX_FAILURES:-3})); then
    die "$JOB failed $failures times in a row on a healthy TPU; look at its output above"
  fi
  sleep "${POLL_SECONDS:-60}"
done
