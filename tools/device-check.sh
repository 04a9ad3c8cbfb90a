#!/usr/bin/env bash
# The device check of issues 11 and 19: one prepared run on a GPU machine (no Rust
# toolchain there), with binaries built on the development machine and carried over.
#
# WHAT IT COVERS NOW
#   - the `cuda` platform of headroom-mem: the `cuda_platform` test executable
#     (cuMemAlloc/cuMemFree segments under `pytorch`, cuMemAddressReserve/cuMemCreate/
#     cuMemMap/cuMemUnmap pages under `expandable`, empty_cache lowering cuMemGetInfo's
#     used bytes, out-of-memory as an error, NoDevice for an absent ordinal), with the
#     allocator's peaks and the driver's and NVML's used bytes;
#   - the CUDA kernels (issue 19): `headroom cuda kernels --arch sm_90 --json` with the
#     NVRTC found on that machine (the torch venv's nvidia/*/lib or the staged wheel's),
#     and `headroom cuda selftest --json`: every op family (noise bit-exact, elementwise,
#     cast, softmax, layer/RMS norm, RoPE, bf16 mma.sync attention with the block-causal
#     mask, causal conv3d, resample, reduce, copy, cuBLASLt GEMM f32, bf16+GELU, fp8 and
#     int8 W8A8 and the widened 8-bit weight) on the
#     GPU against the CPU, max error per op against its tolerance;
#   - the binary: `headroom plan --device cuda` reads the card's capacity from the driver;
#   - the engine on the GPU (every tensor op dispatched to the kernels and cuBLASLt):
#     `headroom generate --device cuda` on the trained `world` model (real weights, f32)
#     and on `tiny`, each against the same run on the CPU (max |gpu - cpu| of the
#     denoised latents, and of the frames);
#   - the stepwise wan2.1-t2v-1.3b session at 480x832 in bf16 (seeded weights) under the
#     `pytorch` and `expandable` allocators: per-block denoise / commit / decode times,
#     allocator peaks, NVML's used bytes sampled during the run, latent and video hashes
#     (byte-identical across allocators is checked), and the 250 ms goal of 4 DMD steps +
#     commit for one block; the same session with `--weights fp8` and `--weights int8`
#     (the 8-bit GEMMs of issue 54) beside it;
#
#   - `headroom bench kernels --device cuda --json`: the Wan-shape GEMMs, attention and
#     conv3d on the GPU in f32 and bf16, and the linears with fp8 and int8 weights, each
#     against a bf16 cuBLASLt GEMM of the FLOP-equivalent shape (bench-kernels.json).
#
# WHAT IT DOES NOT COVER YET
#   - the DiT / VAE golden-fixture tests on the GPU (they are cargo tests on the host
#     device); the CPU-vs-GPU runs above compare whole models instead.
#
# USE
#   Here (the development machine), stage the binaries into .device-bin/ (ignored by git,
#   carried to the GPU machine):
#       tools/device-check.sh --stage
#   There (device tool: carry [".device-bin"], timeout_s about 300):
#       tools/device-check.sh
#   It writes $OUT/device-check.json (summary) and $OUT/device-check.log (full output);
#   without $OUT it writes them to ./device-check-out/. Exit code 0 when every check ran
#   and passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

STAGE=.device-bin

if [[ "${1:-}" == "--stage" ]]; then
  set -e
  grep -qxF "/$STAGE/" .git/info/exclude 2>/dev/null || echo "/$STAGE/" >> "$(git rev-parse --git-path info/exclude)"
  cargo test -j 1 --release -p headroom-mem --features cuda --test cuda_platform --no-run
  cargo build -j 1 --release -p headroom --features cuda
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  exe=$(ls -t target/release/deps/cuda_platform-* | grep -v '\.d$' | head -n 1)
  cp "$exe" "$STAGE/cuda_platform"
  cp target/release/headroom "$STAGE/headroom"
  strip "$STAGE"/* 2>/dev/null || true
  # NVRTC 13.0 (the pinned wheel) for the GPU machine, whose torch venv may hold another.
  # `|| true`: no .venv-nvrtc here is fine (under pipefail a failed ls would end the script).
  nvrtc=$(ls -d .venv-nvrtc/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -n 1 || true)
  if [[ -n "$nvrtc" ]]; then
    mkdir -p "$STAGE/nvrtc"
    cp "$nvrtc"/libnvrtc.so.13 "$nvrtc"/libnvrtc-builtins.so.13.* "$STAGE/nvrtc/"
  else
    echo "no .venv-nvrtc here: the GPU machine's own NVRTC will be used"
  fi
  # NCCL (the ranks backend): staged when it fits the device tool's 64 MiB carry; the
  # nvidia-nccl-cu13 wheel's libnccl.so.2 is 240 MiB (2.30.7) to 330 MiB (2.32.3), so the
  # GPU machine's own NCCL (a torch venv's nvidia/nccl/lib) is used instead.
  nccl=$(ls -d .venv-nvrtc/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -n 1 || true)
  if [[ -n "$nccl" && -f "$nccl/libnccl.so.2" ]]; then
    nccl_bytes=$(stat -c %s "$nccl/libnccl.so.2")
    if (( nccl_bytes < 32 * 1024 * 1024 )); then
      mkdir -p "$STAGE/nccl" && cp "$nccl/libnccl.so.2" "$STAGE/nccl/"
    else
      echo "NCCL not staged: libnccl.so.2 is $((nccl_bytes / 1048576)) MiB, past what the device tool carries (64 MiB in all)"
    fi
  else
    echo "no NCCL wheel here: the GPU machine's own NCCL will be used"
  fi
  echo "staged in $STAGE:"
  du -sh "$STAGE"/*
  total=$(du -sb "$STAGE" | cut -f1)
  echo "total $((total / 1048576)) MiB of the 64 MiB the device tool carries"
  if (( total > 64 * 1024 * 1024 )); then
    # Uncompressed; what the tool counts after compression may be less. The staged
    # NVRTC (about 109 MiB) is the first thing to leave out if a carry is refused.
    echo "warning: $STAGE is past 64 MiB uncompressed; if the device tool refuses it, remove $STAGE/nvrtc" >&2
  fi
  echo "staged; carry \"$STAGE\" and run tools/device-check.sh there"
  exit 0
fi

OUT_DIR="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/device-check.log"
FIGURES=$(mktemp -d)
: > "$LOG"
log() { echo "$*" | tee -a "$LOG"; }

nvml_used() {
  # NVML's used bytes of GPU 0 through nvidia-smi (MiB → B); empty if unavailable.
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null \
      | awk 'NR==1 {printf "%d", $1 * 1048576}'
  fi
}

# The mem CUDA test executable: staged first, then cargo's output folders.
find_test_exe() {
  local candidate
  for candidate in "$STAGE/cuda_platform" \
    $(ls -t target/release/deps/cuda_platform-* target/debug/deps/cuda_platform-* 2>/dev/null | grep -v '\.d$'); do
    if [[ -x "$candidate" && -f "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

find_binary() {
  local candidate
  for candidate in "$STAGE/headroom" target/release/headroom target/debug/headroom; do
    [[ -x "$candidate" ]] && { echo "$candidate"; return 0; }
  done
  return 1
}

results=()   # name|status|detail
record() { results+=("$1|$2|$3"); log "== $1: $2 ${3:+($3)}"; }

log "device-check: $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 | tee -a "$LOG"
NVML_BEFORE=$(nvml_used)

# 1. The mem CUDA tests.
if exe=$(find_test_exe); then
  log "running mem CUDA tests: $exe"
  HEADROOM_DEVICE_CHECK_OUT="$FIGURES" "$exe" --test-threads=1 --nocapture >>"$LOG" 2>&1
  rc=$?
  if grep -q "skipped: no CUDA device" "$LOG"; then
    record mem_cuda_tests skipped "no CUDA device: $(grep -m1 -o 'skipped: no CUDA device.*' "$LOG")"
  elif [[ $rc -eq 0 ]]; then
    record mem_cuda_tests pass "$exe"
  else
    record mem_cuda_tests fail "exit $rc, see device-check.log"
  fi
else
  record mem_cuda_tests missing "no cuda_platform executable in $STAGE/ or target/{release,debug}/deps (run --stage first)"
fi

# 2. The binary: plan reads the card; generate refuses honestly.
PLAN_CAPACITY=""
if bin=$(find_binary); then
  log "binary: $bin"
  if "$bin" plan --device cuda:0 --model wan2.1-t2v-1.3b --chunks 1 --json >"$FIGURES/plan.json" 2>>"$LOG"; then
    PLAN_CAPACITY=$(python3 -c '
import json, sys
def find(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if "capacity" in k and isinstance(x, int):
                return x
            r = find(x)
            if r is not None:
                return r
    if isinstance(v, list):
        for x in v:
            r = find(x)
            if r is not None:
                return r
print(find(json.load(open(sys.argv[1]))) or "")' "$FIGURES/plan.json" 2>/dev/null || true)
    record plan_device_cuda pass "capacity ${PLAN_CAPACITY:-see plan.json}"
  elif grep -q "no CUDA device" "$LOG"; then
    record plan_device_cuda skipped "no CUDA device"
  else
    record plan_device_cuda fail "see device-check.log"
  fi
  # The engine on the GPU against the CPU: same model, seed, inputs and dtype.
  for model in world tiny; do
    ok=1
    for dev in cpu cuda:0; do
      tag="$model-${dev%%:*}"
      "$bin" generate --device "$dev" --model "$model" --frames 9 --json \
        --dump-latents "$FIGURES/$tag.npy" --out "$FIGURES/$tag.mp4" \
        >"$FIGURES/$tag.json" 2>>"$LOG" || ok=0
    done
    if [[ $ok -eq 0 ]]; then
      if grep -q "no CUDA device" "$LOG"; then
        record "generate_${model}_cuda_vs_cpu" skipped "no CUDA device"
      else
        record "generate_${model}_cuda_vs_cpu" fail "see device-check.log"
      fi
      continue
    fi
    diff=$(python3 - "$FIGURES/$model-cpu.npy" "$FIGURES/$model-cuda.npy" <<'PY'
import ast, struct, sys
def read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack_from("<H", data, 8)[0]
    header = ast.literal_eval(data[10:10 + n].decode())
    assert header["descr"] == "<f4", header
    body = data[10 + n:]
    return struct.unpack("<%df" % (len(body) // 4), body)
a, b = read(sys.argv[1]), read(sys.argv[2])
assert len(a) == len(b), (len(a), len(b))
print(max(abs(x - y) for x, y in zip(a, b)) if a else 0.0)
PY
)
    rc=$?
    if [[ $rc -ne 0 ]]; then
      record "generate_${model}_cuda_vs_cpu" fail "could not compare latents"
    else
      # f32 GEMMs without TF32 and f32 kernels: agreement to float rounding, compounded
      # over 4 steps and every block.
      if python3 -c "import sys; sys.exit(0 if float('$diff') <= 1e-2 else 1)"; then
        record "generate_${model}_cuda_vs_cpu" pass "max |gpu - cpu| of the latents $diff"
      else
        record "generate_${model}_cuda_vs_cpu" fail "max |gpu - cpu| of the latents $diff (> 1e-2)"
      fi
    fi
  done

  # The kernels on the GPU.
  if "$bin" bench kernels --device cuda:0 --reps 3 --json >"$FIGURES/bench-kernels.json" 2>>"$LOG"; then
    cp "$FIGURES/bench-kernels.json" "$OUT_DIR/bench-kernels.json"
    record bench_kernels_cuda pass "see bench-kernels.json"
  else
    record bench_kernels_cuda fail "see device-check.log"
  fi

  # The 1.3B-shape stepwise session, bf16, under two allocators.
  for alloc in pytorch expandable; do
    tag="wan13b-$alloc"
    "$bin" generate --device cuda:0 --model wan2.1-t2v-1.3b --width 832 --height 480 \
      --frames 9 --dtype bf16 --allocator "$alloc" --json \
      --dump-latents "$FIGURES/$tag.npy" --out "$FIGURES/$tag.mp4" \
      >"$FIGURES/$tag.json" 2>>"$LOG" &
    pid=$!
    peak=0
    while kill -0 "$pid" 2>/dev/null; do
      used=$(nvml_used)
      [[ -n "$used" && "$used" -gt "$peak" ]] && peak=$used
      sleep 0.2
    done
    wait "$pid"
    rc=$?
    echo "$peak" >"$FIGURES/$tag.nvml"
    if [[ $rc -eq 0 ]]; then
      cp "$FIGURES/$tag.json" "$OUT_DIR/session-$alloc.json"
      record "session_1p3b_bf16_$alloc" pass "nvml peak $peak B; see session-$alloc.json"
    else
      record "session_1p3b_bf16_$alloc" fail "exit $rc; see device-check.log"
    fi
  done
  # The same session with 8-bit DiT linears (fp8: cuBLASLt's fp8 GEMM on sm_89+; int8:
  # its int8 GEMM), beside the bf16 run above on the same card.
  for weights in fp8 int8; do
    if "$bin" generate --device cuda:0 --model wan2.1-t2v-1.3b --width 832 --height 480 \
      --frames 9 --dtype bf16 --weights "$weights" --json --out "$FIGURES/wan13b-$weights.mp4" \
      >"$FIGURES/wan13b-$weights.json" 2>>"$LOG"; then
      cp "$FIGURES/wan13b-$weights.json" "$OUT_DIR/session-$weights.json"
      record "session_1p3b_$weights" pass "see session-$weights.json beside session-pytorch.json"
    else
      record "session_1p3b_$weights" fail "see device-check.log"
    fi
  done
  if [[ -f "$FIGURES/wan13b-pytorch.npy" && -f "$FIGURES/wan13b-expandable.npy" ]]; then
    if cmp -s "$FIGURES/wan13b-pytorch.npy" "$FIGURES/wan13b-expandable.npy" \
      && cmp -s "$FIGURES/wan13b-pytorch.mp4" "$FIGURES/wan13b-expandable.mp4"; then
      record session_bytes_across_allocators pass "latents and video byte-identical"
    else
      record session_bytes_across_allocators fail "latents or video differ between allocators"
    fi
  fi
else
  record binary missing "no headroom binary in $STAGE/ or target/{release,debug}"
fi

# 3. The CUDA kernels: compile report and the GPU-vs-CPU self-test.
if bin=$(find_binary); then
  # NVRTC: the staged 13.0 first, else the torch venv's wheels; cuBLASLt from the venv.
  if [[ -d "$STAGE/nvrtc" ]]; then
    export HEADROOM_CUDA_LIB_DIR="$PWD/$STAGE/nvrtc"
  elif nvrtc=$(ls -d .venv-nvrtc/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -n 1) && [[ -n "$nvrtc" ]]; then
    export HEADROOM_CUDA_LIB_DIR="$PWD/$nvrtc"
  fi
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in "$d"/nvidia/*/lib; do
      [[ -d "$lib" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib"
    done
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
  export HEADROOM_CUDA_CACHE="$FIGURES/cuda-cache"
  # On the GPU machine a missing device is a failure, not a skip.
  export HEADROOM_REQUIRE_GPU=1
  if "$bin" cuda kernels --arch sm_90 --json >"$FIGURES/kernels.json" 2>>"$LOG"; then
    cp "$FIGURES/kernels.json" "$OUT_DIR/cuda-kernels.json"
    record cuda_kernels_compile pass "see cuda-kernels.json"
  else
    record cuda_kernels_compile fail "see device-check.log"
  fi
  "$bin" cuda selftest --json >"$FIGURES/selftest.json" 2>>"$LOG"
  rc=$?
  cat "$FIGURES/selftest.json" >>"$LOG"
  cp "$FIGURES/selftest.json" "$OUT_DIR/cuda-selftest.json" 2>/dev/null
  if [[ $rc -eq 0 ]]; then
    record cuda_selftest pass "every op within its tolerance; see cuda-selftest.json"
  elif grep -q "no CUDA device" "$LOG"; then
    record cuda_selftest skipped "no CUDA device"
  else
    record cuda_selftest fail "exit $rc; see cuda-selftest.json and device-check.log"
  fi
fi

NVML_AFTER=$(nvml_used)

# Summary.
python3 - "$OUT_DIR/device-check.json" "$FIGURES" "${NVML_BEFORE:-}" "${NVML_AFTER:-}" "${results[@]}" <<'PY' || {
import json, os, sys
out, figures, before, after, *rows = sys.argv[1:]
checks = []
for row in rows:
    name, status, detail = row.split("|", 2)
    checks.append({"name": name, "status": status, "detail": detail})
allocator = {}
sessions = {}
for f in sorted(os.listdir(figures)):
    if f.startswith("wan13b-") and f.endswith(".json"):
        alloc = f[len("wan13b-"):-len(".json")]
        try:
            with open(os.path.join(figures, f)) as fh:
                report = json.load(fh)
        except (OSError, ValueError):
            continue
        nvml = os.path.join(figures, "wan13b-%s.nvml" % alloc)
        chunks = report.get("chunks", [])
        first = chunks[0] if chunks else {}
        import hashlib
        digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None
        sessions[alloc] = {
            "chunks": chunks,
            "denoise_plus_commit_s_block0": (first.get("denoise_s", 0) + first.get("commit_s", 0)) if first else None,
            "goal_s": 0.25,
            "allocated_peak_bytes": report.get("allocated_peak_bytes"),
            "reserved_peak_bytes": report.get("reserved_peak_bytes"),
            "nvml_peak_used_bytes": int(open(nvml).read().strip() or 0) if os.path.exists(nvml) else None,
            "latents_sha256": digest(os.path.join(figures, "wan13b-%s.npy" % alloc)),
            "video_sha256": digest(os.path.join(figures, "wan13b-%s.mp4" % alloc)),
        }
for f in sorted(os.listdir(figures)):
    if f.startswith("mem-cuda-") and f.endswith(".json"):
        with open(os.path.join(figures, f)) as fh:
            allocator[f[len("mem-cuda-"):-len(".json")]] = json.load(fh)
summary = {
    "passed": all(c["status"] in ("pass", "not_available") for c in checks),
    "checks": checks,
    "nvml_used_bytes_before": int(before) if before else None,
    "nvml_used_bytes_after": int(after) if after else None,
    "allocator": allocator,
    "sessions_1p3b_bf16_480x832": sessions,
    "not_covered": [
        "the DiT/VAE golden-fixture cargo tests on the GPU (whole models are compared CPU vs GPU instead)",
    ],
}
with open(out, "w") as fh:
    json.dump(summary, fh, indent=2)
print(json.dumps(summary, indent=2))
PY
  # No python3: a minimal summary by hand.
  {
    echo '{"checks": ['
    first=1
    for row in "${results[@]}"; do
      IFS='|' read -r name status detail <<<"$row"
      [[ $first -eq 1 ]] || echo ','
      first=0
      printf '{"name": "%s", "status": "%s"}' "$name" "$status"
    done
    printf '], "nvml_used_bytes_before": %s, "nvml_used_bytes_after": %s}\n' "${NVML_BEFORE:-null}" "${NVML_AFTER:-null}"
  } >"$OUT_DIR/device-check.json"
  cat "$OUT_DIR/device-check.json"
}
rm -rf "$FIGURES"

for row in "${results[@]}"; do
  case "$row" in
    *"|pass|"* | *"|not_available|"*) ;;
    *) exit 1 ;;
  esac
done
exit 0
