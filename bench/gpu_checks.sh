#!/usr/bin/env bash
# The checks that need a GPU (docs/hare.md §7, steps 4 and 4b): the resident
# trainers' gradients on cuda against the same micro-batches computed in
# this process (as they run, and with deterministic algorithms: bitwise),
# and the task switching time on the GPU against the task
# time, staged and unstaged, at the examples' default sizes, and for
# train_lm with a larger batch (longer tasks, the same parameters) and a
# larger model, and the time of one copy of a round's parameters to the GPU
# while another process computes. Each part's output goes to OUT (default
# ./gpu-checks) as well as to the terminal; a part that fails is reported
# and the rest still run.
#
#   PYTHON=python3 bash bench/gpu_checks.sh [OUT]
#
# PYTHON must hold torch with CUDA, msgspec and nvidia-ml-py; the project's
# root goes on PYTHONPATH here.
set -u
out=${1:-gpu-checks}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
status=0

part() {  # part NAME SECONDS COMMAND...: run, tee'd to OUT/NAME.txt, time-boxed
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

part machine 30 bash -c "nvidia-smi -L; $py -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))'"
part cuda_check 120 "$py" "$root/bench/trainer_cuda_check.py" --rounds 3
part cuda_check_deterministic 120 "$py" "$root/bench/trainer_cuda_check.py" --rounds 3 --deterministic
part switch_default 120 "$py" "$root/bench/trainer_switch.py" --device cuda --rounds 6
part switch_unstaged 120 "$py" "$root/bench/trainer_switch.py" --device cuda --rounds 6 --unstaged
part switch_lm_batch128 120 "$py" "$root/bench/trainer_switch.py" --device cuda --rounds 6 \
    --examples train_lm --set batch_size=128
part switch_lm_large 120 "$py" "$root/bench/trainer_switch.py" --device cuda --rounds 6 \
    --examples train_lm --set batch_size=64 --set seq_len=256 --set d_model=512 --set layers=6
part copy_contention 120 "$py" "$root/bench/gpu_copy_contention.py"
exit $status
