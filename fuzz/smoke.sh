#!/usr/bin/env bash
# The ctest smoke of one fuzz target (label fuzz): NOPFS_FUZZ_SMOKE_SECONDS (default 5) of
# coverage-guided fuzzing from a copy of the target's seed corpus. Fails on any crash, leak,
# sanitizer report or broken property, and when the target does not run at all.
# Usage: smoke.sh TARGET_BINARY SEED_CORPUS WORK_DIR
set -euo pipefail
target=$1 seeds=$2 work=$3
rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/* "$work/corpus/"
log=$work/log
if ! "$target" -max_total_time="${NOPFS_FUZZ_SMOKE_SECONDS:-5}" -print_final_stats=1 \
     -artifact_prefix="$work/artifacts/" "$work/corpus" >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "nopfs: fuzz smoke: $(basename "$target") failed; the input is in $work/artifacts/" >&2
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
cov=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -n 's/.*\(cov: [0-9]* ft: [0-9]*\).*/\1/p')
echo "$(basename "$target"): $runs executions; $cov"
if [[ -z $runs || $runs -lt 1000 ]]; then
  echo "nopfs: fuzz smoke: $(basename "$target") ran only ${runs:-0} inputs" >&2
  exit 1
fi
