#!/usr/bin/env bash
# The CUDA and NCCL paths, checked on a GPU machine in one short run (about 5 minutes on one GPU).
#
#   bash benchmark/gpu_check.sh 2>&1 | tee gpu_check.log
#   bash benchmark/gpu_check.sh --rehearse      # the same steps on the CPU, tiny budgets (about 2 minutes)
#
# Needs a CUDA build of torch in the active environment (pip install -r requirements/requirements.txt
# on a Linux GPU machine). On a lent machine that cannot download, carry the wheels that
# benchmark/gpu_wheels.sh fetches (its header says how). Each step prints PASS or FAIL with its SPS;
# the script exits non-zero if any step failed. Paste its output into docs/benchmarks/ with the
# machine and the date.
#
# --rehearse runs every step without a GPU: --no-cuda, gloo in place of NCCL (two processes stand in
# for the GPUs), no --device-ids, one or two iterations each. It checks the script itself (flags, the
# SPS read-back, the PASS/FAIL count), so that a lent GPU's few minutes are not spent on a typo; the
# test suite runs it (tests/test_gpu_check.py). Its SPS mean nothing.
#
# The training steps stay inside GPU_CHECK_BUDGET seconds (default 450): each gets at most 180 s and
# what is left, and a step with under 30 s left is skipped (counted as a failure). With the last
# step (at most 120 s) the whole check fits a 10-minute command. PYTHON names the interpreter (default python3).
set -uo pipefail
rehearse=0
case "${1:-}" in
    "") ;;
    --rehearse) rehearse=1 ;;
    *) echo "error: unknown argument '$1' (the only option is --rehearse)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
if [ "$rehearse" = 1 ]; then threads=1; else threads=4; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} WANDB_MODE=offline PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-450}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

"$PY" - "$rehearse" <<'EOF'
import platform, sys
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}")
print(f"{torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
print(f"host: {platform.node()} {platform.machine()}")
if sys.argv[1] == "1":
    print("REHEARSAL on the CPU: --no-cuda and gloo stand in for CUDA and NCCL; the SPS below mean nothing")
    raise SystemExit(0)
raise SystemExit(0 if torch.cuda.is_available() else 1)
EOF
if [ $? -ne 0 ]; then echo "FAIL: torch sees no CUDA device"; exit 1; fi
if [ "$rehearse" = 1 ]; then
    gpus=2 dev=cpu nccl=gloo cuda=--no-cuda
    atari="--env-id BreakoutNoFrameskip-v4 --num-steps 16 --total-timesteps 256"
    ppo_budget="--total-timesteps 512" mujoco_budget="--num-steps 128 --total-timesteps 128"
    shared_gpu="" ddp_budget="--steps 1 --blocks 1"
else
    gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    dev=cuda nccl=nccl cuda=""
    atari="--env-id BreakoutNoFrameskip-v4 --total-timesteps 40960"
    ppo_budget="--total-timesteps 50000" mujoco_budget="--total-timesteps 20480"
    shared_gpu="--device-ids 0 0" ddp_budget=""
fi

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
# $cuda and the budgets are unquoted on purpose: empty or several words.
run "ppo_$dev" "$PY" "$repo/cleanrl/ppo.py" $ppo_budget $cuda
run "ppo_atari_$dev" "$PY" "$repo/cleanrl/ppo_atari.py" $atari $cuda
run "ppo_continuous_$dev" "$PY" "$repo/cleanrl/ppo_continuous_action.py" --env-id HalfCheetah-v5 $mujoco_budget $cuda
run "multigpu_1proc_$dev" "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari $cuda
# The throughput options: ALE's C++ vector env, bf16 autocast with the bf16 acting copy, torch.compile,
# and the overlap of one half of the envs' emulators with the policy's forward pass for the other half
# (--env-groups 2), which on a GPU has an idle CPU to overlap with (on 2 CPU cores it did not pay).
run "multigpu_1proc_${dev}_ale_bf16" "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari --env-backend ale --bf16 $cuda
run "multigpu_1proc_${dev}_ale_bf16_groups2" "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari --env-backend ale \
    --bf16 --env-groups 2 $cuda
run "multigpu_1proc_${dev}_ale_bf16_compile" "$PY" "$repo/cleanrl/ppo_atari_multigpu.py" $atari --env-backend ale \
    --bf16 --compile $cuda
# NCCL, one process per GPU (1 GPU: a single NCCL process, which still runs the NCCL collectives).
run "multigpu_${nccl}_${gpus}proc" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$gpus" \
    "$repo/cleanrl/ppo_atari_multigpu.py" $atari --num-envs $((8 * gpus)) --backend "$nccl" $cuda
# gloo, two processes sharing GPU 0 (NCCL cannot put two ranks on one GPU).
run "multigpu_gloo_2proc_shared_$dev" "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
    "$repo/cleanrl/ppo_atari_multigpu.py" $atari --num-envs 16 --backend gloo $shared_gpu $cuda
# The gradient averaging itself: one flat all_reduce against DDP on the GPUs.
if (timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$gpus" benchmark/allreduce_vs_ddp.py \
        $ddp_budget >"$work/allreduce.txt" 2>&1); then
    echo "PASS  allreduce_vs_ddp ($nccl, $gpus proc)"; tail -8 "$work/allreduce.txt" | sed 's/^/      /'
else
    echo "FAIL  allreduce_vs_ddp"; tail -40 "$work/allreduce.txt"; failures=$((failures + 1))
fi
echo "gpu_check: $failures failure(s)"
exit $((failures > 0))
