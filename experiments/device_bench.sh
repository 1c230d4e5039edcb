#!/usr/bin/env bash
# experiments/device_bench.py on a GPU machine whose image lacks some of grpo_jax's "train"
# extra, with no package index there.
#
#   bash experiments/device_bench.sh fetch     # where PyPI is reachable: the wheels into .whl/
#   bash experiments/device_bench.sh [ARGS]    # on the GPU machine (carry .whl): installs the
#                                              # wheels into /tmp/site, then runs the benchmark
#
# The run writes device_bench.json and device_bench.log into $OUT (or the current folder);
# ARGS go to device_bench.py (e.g. --parts jax_update,torch_update). The wheels are the
# modules grpo_jax imports that the CUDA image (Python 3.12, jax 0.11.2, flax, optax,
# orbax, transformers, torch, absl, etils, sympy, protobuf...) does not hold: about 18 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

# name==version of every wheel; the module each one brings is in MODULES, same order.
WHEELS=(ml-collections==1.1.0 gguf==0.19.0 tensorflow-datasets==4.9.10 grain==0.2.18
        array-record==0.8.6 dm-tree==0.1.10 immutabledict==4.3.1 simple-parsing==0.1.9
        docstring-parser==0.18.0 tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0
        termcolor==3.3.0 toml==0.10.2 tensorboardX==2.6.5 math-verify==0.9.0
        latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 reasoning-gym==0.1.25
        qwix==0.1.8 portpicker==1.6.0 importlib-resources==7.1.0
        protobuf==7.36.2)   # the protos' runtime they were generated for (tested together)
SDISTS=(promise==2.3)   # no wheel on PyPI: built here (pure Python)
MODULES="ml_collections gguf tensorflow_datasets grain array_record tree immutabledict
         simple_parsing docstring_parser tensorflow_metadata google.api termcolor toml
         tensorboardX math_verify latex2sympy2_extended antlr4 reasoning_gym qwix portpicker
         importlib_resources promise"

if [[ "${1:-}" == fetch ]]; then
  platforms=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
             manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}"
  python3 -m pip wheel -q --no-deps -w .whl "${SDISTS[@]}"
  du -sh .whl
  exit 0
fi

missing=$(python3 - "$MODULES" <<'EOF'
import importlib.util, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
print(" ".join(m for m in sys.argv[1].split() if not found(m)))
EOF
)
if [[ -n "$missing" ]]; then
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "not installed: $missing; run 'bash experiments/device_bench.sh fetch' where PyPI" \
         "is reachable and carry .whl" >&2
    exit 1
  fi
  echo "# installing the carried wheels for: $missing"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

out=${OUT:-.}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
  --format=csv 2>/dev/null | tee "$out/device_bench.log" || true
python3 experiments/device_bench.py --out "$out/device_bench.json" "$@" 2>&1 \
  | tee -a "$out/device_bench.log"
