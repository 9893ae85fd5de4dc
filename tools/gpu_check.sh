#!/usr/bin/env bash
# The GPU checks, in one run on a lent GPU machine (issue 38; bench/README "GPU figures").
# Run tools/gpu_deps.sh here first, then, through the device tool, from the repo root:
#   tools/gpu_check.sh            (carry: .gpudeps; figures and logs land in $OUT)
# On a GPU machine of your own with `make install-gpu` done, PY=.venv/bin/python skips the
# carried dependencies. Steps, each under its own time limit so a hang costs only its step:
#   tests     the GPU tests (tests/test_gpu.py);
#   copy      a commit's copy to host memory, pageable against pinned (bench.gpu.commit_copy);
#   pinning   what would take the first commits' pinning off the training thread: per-tensor
#             blocks, one slab per commit, slabs pinned ahead, torch's multi-threaded pinning,
#             and whether pinning on another thread holds a training loop up (bench.gpu.pinning);
#   profile   raysgd's fp16 step (its own train_batch, and a LightningModule's) and the loop's
#             under torch.profiler (what the CPU waits for);
#   bench_gpu ResNet-50 fp16/bf16 against a hand-written torch.amp loop (make bench-gpu's),
#             a LightningModule in fp16, and raysgd without in-epoch commits (a diagnosis);
#   recovery  a GPU rank killed, with a warm spare and without one;
#   fsdp_gpu  FSDP on NCCL in bf16 against a hand-written FSDP2 loop under torchrun, and the
#             timed epochs in one train() call (one commit: a diagnosis of what commits cost);
#   tax_gpu   the tax benchmark's cells with the ranks on the GPU (bench.tax --gpu);
#   disk_ddp  issue 36's checkpoint costs on CPU (bench.disk, DDP: local disk and S3) with
#             training kept on 2 cores and moto's S3 endpoint on 4 others, so the endpoint
#             takes no CPU from training, as a remote one would not (no GPU used);
#   disk_fsdp the same for FSDP's cases.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1

if [ -d .gpudeps ] && [ "${PY}" = python3 ]; then
  SITE=/tmp/raysgd-site
  mkdir -p "$SITE" && tar -C "$SITE" -xJf .gpudeps/ray-slim.tar.xz
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .gpudeps/*.whl || exit 1
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f .gpudeps/s3-site.tar.xz ]; then  # moto, on the S3 endpoint's path only
  export BENCH_S3_SITE=/tmp/raysgd-s3-site
  mkdir -p "$BENCH_S3_SITE" && tar -C "$BENCH_S3_SITE" -xJf .gpudeps/s3-site.tar.xz
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS COMMAND...: run it, keep its status for the summary
  local name=$1 limit=$2; shift 2
  echo "=== $(date +%T) $name (limit ${limit}s): $*"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - started))s"
  echo "$name exit=$rc seconds=$((SECONDS - started))" >> "$OUT/summary.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY - <<'PY'
import platform, torch, ray, pytorch_lightning, pyarrow
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}), ray {ray.__version__}, "
      f"lightning {pytorch_lightning.__version__}, pyarrow {pyarrow.__version__}, "
      f"device {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU(s), "
      f"{__import__('os').cpu_count()} CPUs")
PY

# GPU_STEPS="tests bench_gpu" runs only those steps (default: all, in this order). Seen on an
# H200 (2026-11-29, at 2144565; the machine's start about a minute of the 15 device minutes):
# tests 106 s, copy 30 s, profile 88 s, bench_gpu 116 s for 6 runs of 100 steps (about 19 s a
# run), recovery 80 s, fsdp_gpu 91 s, disk_ddp 101 s at 2 rounds: each fits beside others in
# one call (10 minutes at most); calls while the machine is warm cost no new start.
#
# STEPS OWED (issue 50), in order; take them off as they run:
#   0. pinning (about 3 minutes, estimated): which fix closes the first commits' cost;
#   1. bench_gpu and fsdp_gpu again once the first commits stop pinning new host memory on
#      the training thread (bench/README "Where the GPU tax goes"), GPU_REPEATS=2;
#   2. tax_gpu (never run: its duration on a GPU is unknown; give it a call of its own);
#   3. disk_fsdp (about 7 minutes estimated; a call of its own), and disk_ddp again at 3 rounds
#      (2 rounds on 11-29 left no verdict).
want() { [ -z "${GPU_STEPS:-}" ] || [[ " $GPU_STEPS " == *" $1 "* ]]; }
want tests && step tests "${GPU_TESTS_S:-240}" $PY -m pytest -v -rs -p no:cacheprovider \
  --durations=0 --timeout 150 tests/test_gpu.py
want copy && step copy "${GPU_COPY_S:-90}" bash -c \
  "$PY -m bench.gpu.commit_copy --state resnet50 && $PY -m bench.gpu.commit_copy --state mlp"
REGISTER=pinned_use_cuda_host_register:True,pinned_num_register_threads:8
want pinning && step pinning "${GPU_PINNING_S:-300}" bash -c "for s in resnet50 mlp; do \
  for w in per_tensor slab prepinned background; do $PY -m bench.gpu.pinning --way \$w \
  --state \$s || exit; done; PYTORCH_CUDA_ALLOC_CONF=$REGISTER $PY -m bench.gpu.pinning \
  --way per_tensor --state \$s || exit; done"
want profile && step profile "${GPU_PROFILE_S:-150}" bash -c "for v in raysgd_amp \
  raysgd_lightning loop_amp; do $PY -m bench.gpu.\$v --precision fp16 --warmup 10 --steps 30 \
  --profile-steps 20 || exit; done"
want bench_gpu && step bench_gpu "${GPU_BENCH_S:-360}" $PY -m bench.gpu \
  --repeats "${GPU_REPEATS:-2}" --steps "${GPU_BENCH_STEPS:-100}" --out "$OUT/gpu.json" \
  --variants ${GPU_VARIANTS:-raysgd_fp16 raysgd_lightning_fp16 loop_fp16 raysgd_fp16_no_commits \
  raysgd_bf16 loop_bf16}
want recovery && step recovery "${GPU_RECOVERY_S:-180}" $PY -m bench.fsdp --gpu \
  --out "$OUT/recovery_gpu.json" \
  --only kill_ddp_gpu_spare1_warm kill_ddp_gpu_spare0 kill_fsdp_gpu_spare1_warm
want fsdp_gpu && step fsdp_gpu "${GPU_FSDP_S:-120}" $PY -m bench.fsdp --gpu \
  --repeats "${GPU_FSDP_REPEATS:-1}" --only raysgd_fsdp_gpu raysgd_fsdp_gpu_one_call \
  torchrun_fsdp_gpu \
  --out "$OUT/fsdp_gpu.json"
want tax_gpu && step tax_gpu "${GPU_TAX_S:-540}" $PY -m bench.tax --gpu \
  --sizes "${GPU_TAX_SIZES:-medium,large}" --repeats "${GPU_TAX_REPEATS:-2}" --out "$OUT/tax_gpu.json"
DISK=(--training-cpus 0,1 --endpoint-cpus 2-5)
want disk_ddp && step disk_ddp "${GPU_DISK_DDP_S:-300}" $PY -m bench.disk "${DISK[@]}" --rounds 3 \
  --cases "ddp mlp, local" "ddp mlp, s3" --out "$OUT/disk_ddp.json"
want disk_fsdp && step disk_fsdp "${GPU_DISK_FSDP_S:-540}" $PY -m bench.disk "${DISK[@]}" --rounds 2 \
  --cases "fsdp every 20, local" "fsdp every 20, s3" --out "$OUT/disk_fsdp.json"
cat "$OUT/summary.txt"
