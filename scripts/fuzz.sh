#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of foreign bytes (docs/fuzzing.md).
# Usage: scripts/fuzz.sh [TARGET] [--runs N] [--jobs N] [--seeds | --build-only]
#   TARGET   one of: wire peer directory manifest catalog catalog_share spank_options share (default:
#            all, in turn)
#   --runs N executions per target (default 10000000)
#   --jobs N parallel build jobs (default 2)
#   --seeds  rewrite the seed corpora fuzz/corpus/<target>/ with nopfs_fuzz_seeds (keeping the
#            regression inputs regress-*) and stop
#   --build-only  build the tree and stop (scripts/test.sh then runs its ctest label fuzz)
# Builds the fuzz tree build-fuzz/ (clang, -DNOPFS_FUZZ=ON: libFuzzer, ASan, UBSan; only the fuzz
# targets and the decoders they link) and runs each target on a working copy of its seed corpus
# (build-fuzz/corpus/<target>/, kept between runs), printing per target the executions, the
# coverage (libFuzzer's cov: edges, ft: features), the corpus size and the crashes; a crashing
# input is saved as build-fuzz/crashes/<target>/crash-<sha1>. Exits non-zero if any target crashed.
# Inputs libFuzzer found slow (slow-unit-*, over 10 s) are counted apart and fail nothing: look at
# them, as a slow decoder of hostile input is a denial of service.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(wire peer directory manifest catalog catalog_share spank_options share)
runs=10000000
jobs=2
seeds=0
build_only=0
only=""
while (($#)); do
  case "$1" in
    --runs) runs=${2:?"--runs needs a number, e.g. --runs 1000000"}; shift 2 ;;
    --jobs) jobs=${2:?"--jobs needs a number, e.g. --jobs 2"}; shift 2 ;;
    --seeds) seeds=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *)
      if [[ " ${targets[*]} " == *" $1 "* ]]; then
        only=$1; shift
      else
        echo "nopfs: fuzz: unknown argument '$1': write a target (${targets[*]}), --runs N," \
             "--jobs N, --seeds or --build-only" >&2
        exit 2
      fi ;;
  esac
done
if ! [[ $runs =~ ^[0-9]+$ ]] || ((runs == 0)); then
  echo "nopfs: fuzz: --runs '$runs': write a positive number of executions, e.g. --runs 1000000" >&2
  exit 2
fi
[[ -n $only ]] && targets=("$only")

scripts/install-deps.sh
args=(-DNOPFS_FUZZ=ON -DNOPFS_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
if command -v ccache >/dev/null; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build-fuzz "${args[@]}" >/dev/null
if ((seeds)); then
  cmake --build build-fuzz -j "$jobs" --target nopfs_fuzz_seeds
  # The generated seeds are rewritten; regression inputs (regress-*, from crashes) are kept.
  for t in "${targets[@]}"; do
    if [[ -d fuzz/corpus/$t ]]; then
      find fuzz/corpus/"$t" -maxdepth 1 -type f ! -name 'regress-*' -delete
    fi
  done
  build-fuzz/bin/nopfs_fuzz_seeds fuzz/corpus
  echo "nopfs: fuzz: seed corpora written under fuzz/corpus/"
  exit 0
fi
if ((build_only)); then
  cmake --build build-fuzz -j "$jobs"
  exit 0
fi
cmake --build build-fuzz -j "$jobs" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
printf '%-14s %12s %8s %8s %8s %8s %7s %s\n' target executions cov ft corpus seconds crashes slow
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t crashes=build-fuzz/crashes/$t log=build-fuzz/fuzz-$t.log
  mkdir -p "$work" "$crashes"
  cp -n fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  start=$SECONDS
  status=0
  build-fuzz/bin/fuzz_"$t" -runs="$runs" -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$work" fuzz/corpus/"$t" >"$log" 2>&1 || status=$?
  done_line=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")
  found=$(find "$crashes" -type f ! -name 'slow-unit-*' | wc -l)
  slow=$(find "$crashes" -type f -name 'slow-unit-*' | wc -l)
  printf '%-14s %12s %8s %8s %8s %8s %7s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
    "${corp:-?}" "$((SECONDS - start))" "$found" "$slow"
  if ((status != 0 || found != 0)); then
    failed=1
    echo "nopfs: fuzz: $t failed (exit $status); log $log, inputs in $crashes/" >&2
    grep -m 5 -E 'ERROR|property broken|runtime error' "$log" >&2 || true
  fi
done
exit $failed
