#!/usr/bin/env bash
# Creates the TPU VM $TPU_NAME: on demand, as a spot VM, or through a queued resource.
#
# Required: TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION
# Optional: CAPACITY=on-demand|spot (default on-demand); QUEUED=1 to request it as the
#   queued resource $QR_NAME (default $TPU_NAME-qr) and wait until it is ACTIVE;
#   CREATE_FLAGS, more gcloud flags (e.g. "--network=my-net --reserved").
# Usage: tpu_scripts/create.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION

read -ra flags <<<"${CREATE_FLAGS:-}"
case ${CAPACITY:=on-demand} in
  on-demand) ;;
  spot) flags+=(--spot) ;;
  *) die "CAPACITY must be on-demand or spot, got '$CAPACITY'" ;;
esac

if ((QUEUED)); then
  tpus queued-resources create "$QR_NAME" --node-id="$TPU_NAME" \
    --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION" "${flags[@]}"
  wait_until_ready || die "queued resource $QR_NAME ended $TPU_STATE before becoming ACTIVE"
else
  tpus tpu-vm create "$TPU_NAME" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "${flags[@]}"
fi
