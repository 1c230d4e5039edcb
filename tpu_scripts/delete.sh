#!/usr/bin/env bash
# Deletes the TPU VM $TPU_NAME, or with QUEUED=1 its queued resource $QR_NAME (--force
# deletes the VM with it). Does not ask for confirmation.
#
# Required: TPU_NAME ZONE PROJECT
# Usage: tpu_scripts/delete.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT

if ((QUEUED)); then
  tpus queued-resources delete "$QR_NAME" --force --quiet
else
  tpus tpu-vm delete "$TPU_NAME" --quiet
fi
