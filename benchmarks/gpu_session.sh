#!/bin/sh
# The checks that need a CUDA device, as one command for a short session on a borrowed GPU machine.
#
#     sh benchmarks/gpu_session.sh [OUT]      # OUT: folder for the logs and rows (default /tmp/gpu_session)
#
# The machine is expected to have python3 with a CUDA torch; the solvers, which it may lack, are taken from wheels
# in .whl/ when that folder exists (for Python 3.12 on x86-64, from the repository root):
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 -d .whl highspy==1.16.0 pyscipopt==6.3.0
#
# It runs the `gpu`-marked tests (the CUDA allocator meter, CUDA RNG replay) and benchmarks/gpu_check.py, whose
# rows land in OUT/gpu_check.json; copy that file to benchmarks/results/ and print the table with
# `.venv/bin/python benchmarks/gpu_check.py --from-json`.
set -u
out=${1:-${OUT:-/tmp/gpu_session}}
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
python3 -c "import torch, highspy; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/device.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/torch/test_cuda.py tests/torch/test_backend_moves.py 2>&1 | tee "$out/pytest_gpu.log"
timeout 420 python3 benchmarks/gpu_check.py --time-limit 30 --repeats 20 --out "$out/gpu_check.json" 2>&1 |
    tee "$out/gpu_check.log"
