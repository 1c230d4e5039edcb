# shellcheck shell=bash
# Shared by the tpu_scripts: required variables, logging, the --dry-run wrapper and the
# gcloud calls every script makes. Sourced, never run.
#
# Commands that change something go through `run_cmd`: with --dry-run it prints them to
# stdout, one shell-quoted line each, and runs nothing; otherwise it logs them to stderr
# and runs them. Logs always go to stderr, so a dry run's stdout is exactly its commands.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034  # REPO_ROOT and PASS_ON are read by the scripts that source this
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
DRY_RUN=0
PASS_ON=() # the flags that hand this script's --dry-run on to the scripts it calls

# Worker-side layout, relative to the worker's home directory (no spaces).
REMOTE_DIR=${REMOTE_DIR:-grpo_jax}
VENV_DIR=${VENV_DIR:-grpo_jax_venv}
# Queued resources carry their own name; the TPU VM they create is $TPU_NAME.
QUEUED=${QUEUED:-0}
QR_NAME=${QR_NAME:-${TPU_NAME:-}-qr}

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

die() {
  log "error: $*"
  exit 1
}

# Parses the flags every script takes: --dry-run and --help (prints the script's header).
parse_args() {
  local arg
  for arg in "$@"; do
    case $arg in
      --dry-run)
        DRY_RUN=1
        # shellcheck disable=SC2034
        PASS_ON=(--dry-run)
        ;;
      -h | --help)
        sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
        exit 0
        ;;
      *) die "unknown argument '$arg'; use --dry-run or --help" ;;
    esac
  done
}

# Exits naming every variable in "$@" that is unset or empty.
require_vars() {
  local name missing=()
  for name in "$@"; do
    [[ -n ${!name:-} ]] || missing+=("$name")
  done
  if ((${#missing[@]})); then
    die "set ${missing[*]} (the --help of this script lists its variables); e.g. export ${missing[0]}=..."
  fi
}

# One word as the shell reads it back: bare when safe, else single-quoted (after the
# `--flag=` of a flag, for reading).
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  elif [[ $1 =~ ^(--[a-z-]+=)(.*)$ ]]; then
    printf "%s'%s'" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]//\'/\'\\\'\'}"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# The command "$@" as one line that a shell runs as the same argv.
quote_cmd() {
  local word line=""
  for word in "$@"; do
    line+="${line:+ }$(quote "$word")"
  done
  printf '%s\n' "$line"
}

run_cmd() {
  if ((DRY_RUN)); then
    quote_cmd "$@"
  else
    log "+ $(quote_cmd "$@")"
    "$@"
  fi
}

# `gcloud compute tpus ARGS --zone --project`, through run_cmd.
tpus() {
  run_cmd gcloud compute tpus "$@" --zone="$ZONE" --project="$PROJECT"
}

# Runs the shell command $1 on every worker of $TPU_NAME.
on_workers() {
  tpus tpu-vm ssh "$TPU_NAME" --worker=all --command="$1"
}

# Sets TPU_STATE to the state of the TPU ($QUEUED=1: of its queued resource): MISSING
# when there is none, UNKNOWN when the query failed otherwise.
#
# TPU_STATE_OVERRIDE replaces the query (tests, and trying babysit.sh). A dry run prints
# the query and takes TPU_STATE_OVERRIDE or PREEMPTED, so it shows a full recovery.
query_state() {
  local query
  if ((QUEUED)); then
    query=(gcloud compute tpus queued-resources describe "$QR_NAME" --format='value(state.state)')
  else
    query=(gcloud compute tpus tpu-vm describe "$TPU_NAME" --format='value(state)')
  fi
  query+=(--zone="$ZONE" --project="$PROJECT")
  if ((DRY_RUN)); then
    quote_cmd "${query[@]}"
    TPU_STATE=${TPU_STATE_OVERRIDE:-PREEMPTED}
  elif [[ -n ${TPU_STATE_OVERRIDE:-} ]]; then
    TPU_STATE=$TPU_STATE_OVERRIDE
  else
    local errors
    errors=$(mktemp)
    if ! TPU_STATE=$("${query[@]}" 2>"$errors"); then
      # Only a resource known to be gone is MISSING: a failed query must not delete a TPU.
      if grep -qiE 'NOT_FOUND|not found' "$errors"; then TPU_STATE=MISSING; else TPU_STATE=UNKNOWN; fi
      log "state query: $(tr '\n' ' ' <"$errors")"
    fi
    rm -f "$errors"
  fi
  log "state: $TPU_STATE"
}

# Polls until the TPU (or queued resource) is READY / ACTIVE; returns 1 if it is gone or
# failed instead. Queued resources can wait for capacity for hours.
wait_until_ready() {
  if ((DRY_RUN)); then
    local TPU_STATE_OVERRIDE=ACTIVE
    query_state
    return 0
  fi
  while true; do
    query_state
    case $TPU_STATE in
      READY | ACTIVE) return 0 ;;
      PREEMPTED | TERMINATED | SUSPENDED | FAILED | MISSING) return 1 ;;
    esac
    sleep "${POLL_SECONDS:-60}"
  done
}
