#!/usr/bin/env bash
# Copies the code to every worker of $TPU_NAME and installs it with jax[tpu] in a venv.
#
# REPO is a local checkout (sent as a tarball without .git, venvs and workdirs) or a git
# URL (cloned on each worker; REPO_REF picks a branch or tag). The venv gets Python
# $PYTHON_VERSION from uv, since the TPU images' system Python is older than jax needs.
# Re-running it updates the code and the venv in place.
#
# Required: TPU_NAME ZONE PROJECT REPO
# Optional: REPO_REF; PYTHON_VERSION (default 3.12); REMOTE_DIR (default grpo_jax) and
#   VENV_DIR (default grpo_jax_venv), both under the workers' home directory.
# Usage: tpu_scripts/setup.sh [--dry-run]

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
require_vars TPU_NAME ZONE PROJECT REPO

code="\$HOME/$REMOTE_DIR"
if [[ -d $REPO ]]; then
  archive="${TMPDIR:-/tmp}/$TPU_NAME-$REMOTE_DIR.tar.gz"
  run_cmd tar -czf "$archive" --exclude=.git --exclude=.venv --exclude=workdirs \
    --exclude=__pycache__ -C "$REPO" .
  tpus tpu-vm scp "$archive" "$TPU_NAME:$REMOTE_DIR.tar.gz" --worker=all
  on_workers "rm -rf \"$code\" && mkdir -p \"$code\" && tar -xzf \"$code.tar.gz\" -C \"$code\""
else
  on_workers "rm -rf \"$code\" && git clone --depth=1 ${REPO_REF:+--branch=$(quote "$REPO_REF") }$(quote "$REPO") \"$code\""
fi

venv="\$HOME/$VENV_DIR"
uv="\$HOME/.local/bin/uv"
# --break-system-packages: on images whose Python is marked externally managed (PEP 668).
get_uv="python3 -m pip install --user --quiet uv || python3 -m pip install --user --quiet --break-system-packages uv"
on_workers "{ $get_uv; } && \"$uv\" venv --allow-existing --python=${PYTHON_VERSION:-3.12} \"$venv\" && \"$uv\" pip install --python=\"$venv/bin/python\" -e \"${code}[train,tpu]\""
