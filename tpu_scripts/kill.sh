#!/usr/bin/env bash
# Stops every trainer process on every worker of $TPU_NAME and removes the libtpu lock
# file, so the next run can open the TPU ("TPU in use by another process").
#
# Required: TPU_NAME ZONE PROJECT
# Usage: tpu_scripts/kill.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT

# '[g]rpo_jax.main' matches the trainer but not this command's own shell, whose command
# line holds the pattern as written: pkill -f would otherwise kill the shell running it.
pattern='[g]rpo_jax[.]main'
on_workers "sudo pkill -TERM -f \"$pattern\" || true; sleep 5; sudo pkill -KILL -f \"$pattern\" || true; sudo rm -f /tmp/libtpu_lockfile"
