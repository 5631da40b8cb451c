#!/usr/bin/env bash
# The one test command: set-up, the CUDA-if-present build and its tests, the no-CUDA build
# and its unit tests, the end-to-end and interop tests against the binary, then the fuzzers.
# Stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${QFORGE_JOBS:-2}
FUZZ_SECONDS=${QFORGE_FUZZ_SECONDS:-20}
CTEST_PASSED=0
CTEST_FAILED=0
CTEST_SKIPPED=0
PYTEST_PASSED=0
PYTEST_FAILED=0
PYTEST_SKIPPED=0

# Each section's wall time, printed at its end and again in the summary, so that a slow run (a
# fresh machine building llama.cpp, a slow build, a slow test) shows where its time went.
SECTION_NAME=""
SECTION_START=$SECONDS
SECTION_TIMES=()
end_section() {
  if [[ -n "$SECTION_NAME" ]]; then
    local took=$((SECONDS - SECTION_START))
    SECTION_TIMES+=("$(printf '%6d s  %s' "$took" "$SECTION_NAME")")
    printf -- '---- %s took %d s\n' "$SECTION_NAME" "$took"
  fi
  SECTION_NAME=""
}
section() {
  end_section
  SECTION_NAME=$*
  SECTION_START=$SECONDS
  printf '\n==== %s ====\n' "$*"
}
# A run that stops at a failure says how long its last section ran too.
trap end_section EXIT

# Runs ctest on a build tree, echoing its output, and adds its counts to the totals. ctest counts
# a skipped test (GTEST_SKIP, through gtest_discover_tests' SKIP_REGULAR_EXPRESSION) among the
# passed ones; it lists each under "The following tests did not run:" as "NN - Name (Skipped)",
# and those are counted apart here.
run_ctest() {
  local dir=$1 log rc=0
  log=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$JOBS" 2>&1 | tee "$log" || rc=$?
  # "100% tests passed, 0 tests failed out of 12"
  local line
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
  local skipped
  skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" || true)
  rm -f "$log"
  if [[ -n "$line" ]]; then
    local failed total
    failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
    CTEST_PASSED=$((CTEST_PASSED + total - failed - skipped))
    CTEST_FAILED=$((CTEST_FAILED + failed))
    CTEST_SKIPPED=$((CTEST_SKIPPED + skipped))
  elif ((rc == 0)); then
    echo "error: ctest in $dir ran no test" >&2
    return 1
  fi
  if ((rc != 0)); then
    echo "error: unit tests failed in $dir (ctest exit $rc)" >&2
  fi
  return "$rc"
}

section "setup"
bash scripts/setup.sh
section "setup of the peers (llmcompressor, llama-cpp-python, GPTQModel)"
# The peer quantizers (llmcompressor) in their own venv, for tests/interop/test_tiny_llama.py.
bash scripts/setup_peers.sh
# Costly fixtures (the trained tiny Llama, the peer's outputs) are made once and kept here.
export QFORGE_FIXTURE_CACHE=${QFORGE_FIXTURE_CACHE:-$PWD/build/fixture-cache}
mkdir -p "$QFORGE_FIXTURE_CACHE"

# A compiler cache, where the machine has one, makes the three builds below share work.
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD"
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# Interop gtests (PyTorch, safetensors, PEFT fixtures) run their fixture scripts with this Python.
QFORGE_PYTHON="$PWD/.venv/bin/python"
export QFORGE_PYTHON

# A machine with a GPU must run the CUDA paths: QFORGE_REQUIRE_CUDA=1 turns every CUDA test that
# would skip (no device answering, no CUDA or cuBLAS in the build, a driver the toolkit does not
# match) into a failure, so such a machine cannot pass by running everything on the CPU. It holds
# for the CUDA build's tests and the pytest run against its binary, not for build-nocuda.
REQUIRE_CUDA=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  REQUIRE_CUDA=1
  echo "nvidia-smi lists a GPU: CUDA tests must run (QFORGE_REQUIRE_CUDA=1)"
fi

section "build (Release, -Werror, CUDA if nvcc is present)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQFORGE_WERROR=ON "${LAUNCHER[@]}"
cmake --build build -j"$JOBS"

section "unit tests (build)"
QFORGE_REQUIRE_CUDA=$REQUIRE_CUDA run_ctest build

section "build-nocuda (QFORGE_CUDA=OFF)"
cmake -S . -B build-nocuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DQFORGE_WERROR=ON \
  -DQFORGE_CUDA=OFF -DQFORGE_TESTS=ON -DQFORGE_BENCH=OFF "${LAUNCHER[@]}"
cmake --build build-nocuda -j"$JOBS"

section "unit tests (build-nocuda)"
QFORGE_REQUIRE_CUDA=0 run_ctest build-nocuda  # no CUDA here by design: its CUDA tests skip

section "CLI and interop tests (pytest)"
pytest_log=$(mktemp)
rc=0
QFORGE_REQUIRE_CUDA=$REQUIRE_CUDA QFORGE_BIN=build/qforge \
  .venv/bin/python -m pytest -q -rs tests/cli tests/interop 2>&1 |
  tee "$pytest_log" || rc=$?
# The closing line looks like "12 passed, 1 skipped in 3.4s" or "1 failed, 11 passed in ...".
summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$pytest_log" | tail -1 || true)
rm -f "$pytest_log"
# Sums "N <word>" in the closing line; 0 when absent (grep finding nothing is not an error here).
count() { { grep -oE "[0-9]+ $1" <<<"$summary" || true; } | awk '{n += $1} END {print n + 0}'; }
PYTEST_PASSED=$(count passed)
PYTEST_FAILED=$(($(count failed) + $(count 'errors?')))
PYTEST_SKIPPED=$(count skipped)
if ((rc == 5)); then
  echo "error: pytest collected no tests in tests/cli tests/interop" >&2
  exit 1
elif ((rc != 0)); then
  echo "error: pytest failed (exit $rc)" >&2
  exit "$rc"
fi

section "fuzz (libFuzzer, ${FUZZ_SECONDS}s per target)"
shopt -s nullglob
fuzz_sources=(tests/fuzz/fuzz_*.cpp)
if ((${#fuzz_sources[@]} == 0)); then
  echo "no tests/fuzz/fuzz_*.cpp: nothing to fuzz"
elif ! command -v clang++ >/dev/null 2>&1; then
  echo "error: fuzz targets exist but clang++ is missing (scripts/setup.sh installs it)" >&2
  exit 1
else
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQFORGE_FUZZ=ON \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DQFORGE_CUDA=OFF \
    -DQFORGE_TESTS=OFF -DQFORGE_BENCH=OFF "${LAUNCHER[@]}"
  cmake --build build-fuzz -j"$JOBS" --target qforge_fuzzers
  fuzzers=(build-fuzz/tests/fuzz/fuzz_*)
  for bin in "${fuzzers[@]}"; do
    [[ -f "$bin" && -x "$bin" ]] || continue
    name=$(basename "$bin")
    # New inputs go to a scratch corpus inside the build tree; the tracked seed corpus,
    # given second, is only read.
    work="build-fuzz/corpus/$name"
    mkdir -p "$work" build-fuzz/artifacts
    corpora=("$work")
    seeds="tests/fuzz/corpus/${name#fuzz_}"
    [[ -d "$seeds" ]] && corpora+=("$seeds")
    echo "--- $name over ${corpora[*]}"
    "$bin" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
      -artifact_prefix="build-fuzz/artifacts/$name-" "${corpora[@]}"
  done
fi
shopt -u nullglob

end_section
printf '\n==== summary ====\n'
printf '%s\n' "${SECTION_TIMES[@]}"
printf '%6d s  in all\n' "$SECONDS"
echo "ctest: $CTEST_PASSED passed, $CTEST_FAILED failed, $CTEST_SKIPPED skipped;" \
  "pytest: $PYTEST_PASSED passed, $PYTEST_FAILED failed, $PYTEST_SKIPPED skipped"
echo "$((CTEST_PASSED + PYTEST_PASSED)) passed, $((CTEST_FAILED + PYTEST_FAILED)) failed," \
  "$((CTEST_SKIPPED + PYTEST_SKIPPED)) skipped"
