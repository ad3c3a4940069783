#!/usr/bin/env bash
# Build the wheel and sdist, check them, install the wheel WITHOUT extras into a fresh virtual
# environment, and use it as a new user would: the demo, a picture that needs an extra (must
# exit 2 and name the extra), a plan of an einsum and of a program each verified on the
# devices, and `run` (a stream) on two small .npy files.
#
#     scripts/wheel_smoke.sh [python] [jax-version] [venv-python]
#
# python: the project's venv python, for build/twine; jax-version: the JAX (and jaxlib) to
# install beside the wheel, e.g. 0.9.2, the oldest shardwise supports (default or "": the
# newest its requirement admits); venv-python: the Python of the fresh environment (default
# python3; JAX 0.11 and later need Python 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
JAX=${2:-}
VENV_PYTHON=${3:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
"$PY" -m twine check --strict "$WORK"/dist/* >"$WORK/twine.log" 2>&1 \
    || { cat "$WORK/twine.log"; exit 1; }
wheel=$(ls "$WORK"/dist/*.whl)
# list to a file first: with pipefail, `unzip | grep -q` fails whenever grep exits before unzip
# has written everything (unzip dies of SIGPIPE), a race that once failed a clean build
unzip -l "$wheel" >"$WORK/wheel.txt"
grep -q 'csrc/.*\.cc' "$WORK/wheel.txt" || { echo "smoke: the wheel lacks the native kernels' C++ sources"; exit 1; }

"$VENV_PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "$wheel" ${JAX:+"jax==$JAX" "jaxlib==$JAX"} \
    >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; exit 1; }
SW="$WORK/venv/bin/shardwise"
cd "$WORK"  # away from the source tree, so only the installed package can be imported

"$SW" --version
"$WORK/venv/bin/python" -c "import jax; print('smoke: on JAX', jax.__version__)"
"$SW" demo --size small >demo.log 2>&1 || { cat demo.log; exit 1; }
grep -q "skipped S5" demo.log || { echo "smoke: the demo did not say it skipped S5 without Dask"; cat demo.log; exit 1; }

set +e
"$SW" explain 'nd,nd->n' --shapes 64x32,64x32 --mesh x=8 --in x --in x --svg flow.svg >svg.log 2>&1
code=$?
set -e
if [ "$code" != 2 ] || ! grep -q "pip install 'shardwise\[pictures\]'" svg.log; then
    echo "smoke: explain --svg without matplotlib exited $code (want 2, naming the extra):"
    cat svg.log
    exit 1
fi

"$WORK/venv/bin/python" -c "import numpy as np; np.save('a.npy', np.ones((1000, 8), 'float32')); np.save('b.npy', np.full((1000, 8), 2, 'float32'))"
"$SW" run 'nd,nd->n' a.npy b.npy --out out.npy >run.log 2>&1 || { cat run.log; exit 1; }
"$WORK/venv/bin/python" -c "import numpy as np; r = np.load('out.npy'); assert r.shape == (1000,) and np.allclose(r, 16), r[:4]"
"$SW" plan 'nd,nd->n' --shapes 400x1000,400x1000 --mesh x=2,y=4 --verify --json >plan.json 2>plan.log \
    || { cat plan.log; exit 1; }
"$SW" plan --model mlp --batch 16 --hidden 64 --ffn 128 --mesh data=2,model=4 --profile cpu-2core \
    --verify --json >program.json 2>program.log || { cat program.log; exit 1; }
"$WORK/venv/bin/python" - <<'PY'
import json
einsum, program = json.load(open("plan.json")), json.load(open("program.json"))
assert all(s["verified"]["collectives_match"] for s in einsum["strategies"] if s.get("verified")), einsum
assert all(p["verified"]["collectives_match"] for p in program["plans"]), program
PY
echo "smoke: the wheel installs without extras and works ($(basename "$wheel"), JAX ${JAX:-newest})"
