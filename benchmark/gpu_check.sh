#!/usr/bin/env bash
# The CUDA and NCCL paths, checked on a GPU machine in one short run (about 5 minutes on one GPU).
#
#   bash benchmark/gpu_check.sh 2>&1 | tee gpu_check.log
#
# Needs a CUDA build of torch in the active environment (pip install -r requirements/requirements.txt
# on a Linux GPU machine). On a lent machine that cannot download, carry the wheels that
# benchmark/gpu_wheels.sh fetches (its header says how). Each step prints PASS or FAIL with its SPS;
# the script exits non-zero if any step failed. Paste its output into docs/benchmarks/ with the
# machine and the date.
#
# The training steps stay inside GPU_CHECK_BUDGET seconds (default 450): each gets at most 180 s and
# what is left, and a step with under 30 s left is skipped (counted as a failure). With the last
# step (at most 120 s) the whole check fits a 10-minute command. PYTHON names the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} WANDB_MODE=offline PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-450}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

"$PY" - <<'EOF'
import torch, platform
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}")
print(f"{torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
print(f"host: {platform.node()} {platform.machine()}")
raise SystemExit(0 if torch.cuda.is_available() else 1)
EOF
if [ $? -ne 0 ]; then echo "FAIL: torch sees no CUDA device"; exit 1; fi
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")

# run NAME COMMAND...: run in a fresh folder, report PASS/FAIL and the last SPS the run logged.
run() {
    local name=$1; shift
    local dir="$work/$name"
    mkdir -p "$dir"
    local start=$SECONDS limit=$((budget - SECONDS))
    if [ "$limit" -lt 30 ]; then
        echo "FAIL  $name  (skipped: the ${budget}s budget is spent)"; failures=$((failures + 1)); return
    fi
    [ "$limit" -gt 180 ] && limit=180
    if (cd "$dir" && timeout "$limit" "$@" >"$dir/log.txt" 2>&1); then
        local sps
        sps=$("$PY" - "$dir" <<'EOF'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
runs = glob.glob(f"{sys.argv[1]}/runs/*")
acc = EventAccumulator(runs[0], size_guidance={"scalars": 0}); acc.Reload()
print(int(acc.Scalars("charts/SPS")[-1].value) if "charts/SPS" in acc.Tags()["scalars"] else "-")
EOF
)
        echo "PASS  $name  SPS=$sps  wall=$((SECONDS - start))s"
    else
        echo "FAIL  $name  (exit $?, log below)"; tail -20 "$dir/log.txt"; failures=$((failures + 1))
    fi
    grep -h -E "rank=[0-9]+ (local_rank|done)" "$dir/log.txt" 2>/dev/null | sed 's/^/      /'
}

repo=$(pwd)
atari="--env-id BreakoutNoFrameskip-v4 --total-timesteps 40960"
run ppo_cuda "$PY" "$repo/cleanrl/ppo.py" --total-timesteps 50000
run ppo_atari_cuda "$PY" "$repo/cleanrl/ppo_atari.py" $atari
run ppo_continuous_cuda "$PY" "$repo/cleanrl/ppo_continuous_action.py" --env-id HalfCheetah-v5 --total-timesteps 20480
run multigpu_1proc_cuda "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari
# The throughput options on CUDA: ALE's C++ vector env, bf16 autocast with the bf16 acting copy, torch.compile.
run multigpu_1proc_cuda_ale_bf16 "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari --env-backend ale --bf16
run multigpu_1proc_cuda_ale_bf16_compile "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari --env-backend ale \
    --bf16 --compile
# NCCL, one process per GPU (1 GPU: a single NCCL process, which still runs the NCCL collectives).
run "multigpu_nccl_${gpus}proc" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$gpus" "$repo/cleanrl/ppo_atari_multigpu.py" \
    $atari --num-envs $((8 * gpus)) --backend nccl
# gloo, two processes sharing GPU 0 (NCCL cannot put two ranks on one GPU).
run multigpu_gloo_2proc_shared_gpu "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 "$repo/cleanrl/ppo_atari_multigpu.py" \
    $atari --num-envs 16 --backend gloo --device-ids 0 0
# The gradient averaging itself: one flat all_reduce against DDP on the GPUs.
if (timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$gpus" benchmark/allreduce_vs_ddp.py \
        >"$work/allreduce.txt" 2>&1); then
    echo "PASS  allreduce_vs_ddp (nccl, $gpus proc)"; tail -8 "$work/allreduce.txt" | sed 's/^/      /'
else
    echo "FAIL  allreduce_vs_ddp"; tail -20 "$work/allreduce.txt"; failures=$((failures + 1))
fi
echo "gpu_check: $failures failure(s)"
exit $((failures > 0))
