#!/usr/bin/env bash
# Build the wheel and sdist, check them, install the wheel WITHOUT extras into a fresh virtual
# environment, and use it as a new user would: the demo, a picture that needs an extra (must
# exit 2 and name the extra), and `run` on two small .npy files.
#
#     scripts/wheel_smoke.sh [python]      (python: the project's venv python, for build/twine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
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

python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "$wheel" >"$WORK/pip.log" 2>&1 \
    || { cat "$WORK/pip.log"; exit 1; }
SW="$WORK/venv/bin/shardwise"
cd "$WORK"  # away from the source tree, so only the installed package can be imported

"$SW" --version
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
echo "smoke: the wheel installs without extras and works ($(basename "$wheel"))"
