#!/usr/bin/env bash
# Build, run and minimise headroom's fuzz targets on the stable toolchain (see README.md).
#
#   fuzz/run.sh build                  build every target (cargo fuzz, no sanitizer)
#   fuzz/run.sh seeds                  write the generated seed inputs to fuzz/work/seeds
#   fuzz/run.sh run TARGET [SECONDS]   fuzz TARGET (default 900 s) at nice 19, one core
#   fuzz/run.sh merge TARGET           minimise fuzz/corpus/TARGET plus what a run found
#   fuzz/run.sh replay TARGET          run TARGET once over fuzz/corpus/TARGET (no fuzzing)
#
# New inputs go to fuzz/work/TARGET, crashes to fuzz/artifacts/TARGET/, a log to
# fuzz/work/TARGET.log; only `merge` writes fuzz/corpus/. Every run uses
# -rss_limit_mb=2048 -timeout=10 and the target's -max_len; the fuzz binaries also
# abort on any allocation that takes the live heap past 256 MiB (src/lib.rs).
set -euo pipefail
cd "$(dirname "$0")"

TARGETS="pickle pth safetensors npy camera config image image_url protocol"
BIN=target/x86_64-unknown-linux-gnu/release
# One core per libFuzzer process: no tensor worker threads (they only add wake-ups).
export HEADROOM_THREADS=1

max_len() {
  case "$1" in
    npy) echo 1024 ;;
    camera) echo 2048 ;;
    pickle | safetensors | config | protocol) echo 4096 ;;
    pth | image) echo 8192 ;;
    image_url) echo 12288 ;;
    *) echo "unknown target $1 (one of: $TARGETS)" >&2; exit 2 ;;
  esac
}

flags() {
  echo "-rss_limit_mb=2048 -timeout=10 -max_len=$(max_len "$1") -print_final_stats=1"
}

case "${1:-}" in
  build)
    # -s none: no sanitizer, so stable rustc works; cargo fuzz still adds the SanitizerCoverage
    # passes (inline 8-bit counters, PC table, compare tracing) and --cfg fuzzing.
    # -a: debug assertions (and so overflow checks) on in the release build.
    (cd .. && nice -n 19 cargo fuzz build -s none -a)
    ;;
  seeds)
    python3 seeds/make_seeds.py work/seeds
    ;;
  run)
    t="$2"
    secs="${3:-900}"
    mkdir -p "work/$t" "artifacts/$t" "corpus/$t"
    seeds=()
    [ -d "work/seeds/$t" ] && seeds=("work/seeds/$t")
    # The CPU time the run got (it shares the cores at nice 19) goes to stderr.
    TIMEFORMAT="$t: %R s wall, %U s user + %S s system CPU"
    # shellcheck disable=SC2046
    time nice -n 19 "$BIN/$t" "work/$t" "corpus/$t" "${seeds[@]}" $(flags "$t") \
      -max_total_time="$secs" -artifact_prefix="artifacts/$t/" 2>"work/$t.log" || {
      echo "$t stopped with a finding; see fuzz/work/$t.log and fuzz/artifacts/$t/" >&2
      exit 1
    }
    grep -E "stat::|Done" "work/$t.log" | tail -n 12
    ;;
  merge)
    t="$2"
    rm -rf "corpus/$t.new"
    mkdir -p "corpus/$t.new" "work/$t"
    seeds=()
    [ -d "work/seeds/$t" ] && seeds=("work/seeds/$t")
    # shellcheck disable=SC2046
    nice -n 19 "$BIN/$t" -set_cover_merge=1 "corpus/$t.new" "corpus/$t" "work/$t" "${seeds[@]}" \
      $(flags "$t") 2>"work/$t.merge.log"
    rm -rf "corpus/$t"
    mv "corpus/$t.new" "corpus/$t"
    echo "$t: $(ls "corpus/$t" | wc -l) inputs, $(du -sh "corpus/$t" | cut -f1)"
    ;;
  replay)
    t="$2"
    # shellcheck disable=SC2046
    "$BIN/$t" $(flags "$t") -runs=0 "corpus/$t"
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
