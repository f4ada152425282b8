#!/usr/bin/env bash
# relay's GPU check, one command from the repository root of a checkout:
#
#     scripts/gpu_check.sh [RESULTS_DIR]
#
# Needs an NVIDIA GPU and python3 with torch (a CUDA build, which brings triton), attrs,
# jinja2, pytest and hypothesis; no network and no install: relay is imported from the
# checkout (PYTHONPATH=.). Results go to RESULTS_DIR, else $OUT, else ./gpu-results: one
# log per step, summary.txt (PASS/FAIL/SKIP per step, then the figures), figures.md (the
# figures to record), pytest-gpu.xml, overlap.json, demo-decode.json, demo-eagle.json and
# bench.json.
# Every step runs even when an earlier one failed; the exit status is 1 if any step
# failed or timed out. Each step has its own time limit; the default limits add up to
# 525 s and the whole run stays under GPU_CHECK_BUDGET_S seconds (default 540), so a
# default run fits one 10-minute device call with its figures.
#
# Environment:
#   PYTHON              the interpreter (default python3)
#   GPU_CHECK_STEPS     the steps to run, space-separated (default: all, in order)
#   GPU_CHECK_BUDGET_S  the whole run's time limit in seconds (default 540)
#   GPU_CHECK_LIMIT_<STEP>  one step's limit, e.g. GPU_CHECK_LIMIT_RACECHECK=600
#   GPU_CHECK_DEMO_ARGS more `relay demo` flags for demo-decode and demo-eagle
# See docs/gpu.md for what each step checks and what to record afterwards.
set -uo pipefail

RESULTS=${1:-${OUT:-./gpu-results}} # relative to where the script was started
mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-540}
SKIP_RC=77 # a step that cannot run here (a tool is missing) exits 77: SKIP, not FAIL

# relay from this checkout, and nothing written into it (bytecode, caches).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
HYPOTHESIS_STORAGE_DIRECTORY=$(mktemp -d) || exit 2
export HYPOTHESIS_STORAGE_DIRECTORY
export PY RESULTS SKIP_RC

# `python -m relay` once relay/__main__.py exists; until then the console script's entry.
if [[ -f relay/__main__.py ]]; then
    RELAY=("$PY" -m relay)
else
    RELAY=("$PY" -c 'import sys; from relay.cli import main; sys.exit(main())')
fi

# A short workload for the sanitizers, which slow every kernel down many times over
# (under racecheck a 4-request decode demo took 23 s a run, H200, 2026-11-27): the tiny
# model, 4 requests of 4 to 16 tokens, one sync and one overlap run per mode, the
# overlap run's decode steps replaying CUDA graphs.
SHORT=(scripts/gpu_overlap.py --device cuda --short --modes decode eagle)

# -- steps: each runs in its own bash, stdout and stderr into RESULTS/<step>.log ----------

shown() { # COMMAND...: write the command into the log, then run it
    printf '$'
    printf ' %q' "$@"
    printf '\n'
    "$@"
}

step_env() {
    echo "date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo 'unknown (not a git checkout)')"
    git status --short 2>/dev/null | sed 's/^/  changed: /'
    local ok=0
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L || ok=1
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    else
        echo "nvidia-smi: not found"
        ok=1
    fi
    "$PY" - <<'EOF'
import importlib.metadata, platform, sys
import attrs, hypothesis, jinja2, pytest, torch
import relay
try:
    triton = importlib.metadata.version("triton")
except importlib.metadata.PackageNotFoundError:
    triton = "not installed (the gates of tests/gpu need it)"
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA "
      f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, triton {triton}, "
      f"attrs {attrs.__version__}, jinja2 {jinja2.__version__}, pytest "
      f"{pytest.__version__}, hypothesis {hypothesis.__version__}")
print(f"relay {getattr(relay, '__version__', '?')} from {relay.__file__}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device (a CPU build of torch, or no driver)")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, compute capability {p.major}.{p.minor}, "
          f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
EOF
    [[ $? == 0 && $ok == 0 ]]
}

step_generate_check() {
    # The drift check re-renders every schema, which needs ruff (the generate extra);
    # the GPU image has none, and CI runs this check on every commit anyway.
    if [[ -z ${RELAY_RUFF:-} ]] && ! "$PY" -c 'import ruff' 2>/dev/null; then
        echo "ruff is not installed here (set RELAY_RUFF to a ruff binary): the drift check runs in CI"
        return "$SKIP_RC"
    fi
    shown "${RELAY[@]}" generate --check
}

step_reused_event() {
    # The gated stream test whose fix (a fill_ kernel behind the held gate, not a host
    # scalar copy) has not yet run on a GPU: on its own, so its line says so.
    shown "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests/gpu/test_gpu_streams.py -k reused_event
    local rc=$?
    if grep -qE '^SKIPPED .*needs a CUDA device' "$RESULTS/reused-event.log"; then
        echo "FAIL: skipped for want of a CUDA device"
        return 1
    fi
    if ! grep -qE '[1-9][0-9]* passed' "$RESULTS/reused-event.log"; then
        echo "FAIL: no test ran (renamed? -k reused_event selects none)"
        return 1
    fi
    return $rc
}

step_pytest_gpu() {
    # -m gpu: tests/gpu/ and the CUDA case of every device-parametrized test. A test module
    # that cannot be imported here (a dev tool missing) is reported, and the rest still run.
    shown "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider --continue-on-collection-errors \
        --junitxml="$RESULTS/pytest-gpu.xml" tests
    local rc=$?
    # pytest's -rs lines only: the phrase also appears in tracebacks of the tests' source.
    if grep -qE '^SKIPPED .*needs a CUDA device' "$RESULTS/pytest-gpu.log"; then
        echo "FAIL: GPU tests were skipped for want of a CUDA device"
        return 1
    fi
    return $rc
}

# The demo steps: its CUDA default (the gpu model over CUDA graphs), one timed pair (the
# overlap step measures the bars over more); GPU_CHECK_DEMO_ARGS comes last and wins.
step_demo_decode() {
    # shellcheck disable=SC2086 # GPU_CHECK_DEMO_ARGS is a list of flags
    shown "${RELAY[@]}" demo --device cuda --mode decode --repeat 1 --no-generate \
        --json "$RESULTS/demo-decode.json" ${GPU_CHECK_DEMO_ARGS:-}
}

step_demo_eagle() {
    # shellcheck disable=SC2086
    shown "${RELAY[@]}" demo --device cuda --mode eagle --repeat 1 --no-generate \
        --json "$RESULTS/demo-eagle.json" ${GPU_CHECK_DEMO_ARGS:-}
}

step_bench() {
    # Every shape of the default grid, 7 samples a side instead of 15.
    shown "${RELAY[@]}" bench --device cuda --repeat 7 --json "$RESULTS/bench.json"
}

step_overlap() {
    # The overlap bars with the demo's CUDA default (its gpu model, decode steps replaying
    # CUDA graphs): occupancy >= 95%, efficiency >= 90%, outputs identical to sync.
    shown "$PY" scripts/gpu_overlap.py --device cuda --repeat 2 --json "$RESULTS/overlap.json"
}

step_torch_sanitizer() {
    # torch's own CUDA sanitizer (CSAN): tensor accesses from streams not ordered by an
    # event or a synchronize; the relay's fences and host mirror are exactly that.
    TORCH_CUDA_SANITIZER=1 shown "$PY" "${SHORT[@]}"
}

find_compute_sanitizer() {
    local dir
    command -v compute-sanitizer && return
    for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /opt/cuda; do
        [[ -n $dir && -x $dir/bin/compute-sanitizer ]] && echo "$dir/bin/compute-sanitizer" && return
    done
    return 1
}

compute_sanitizer() { # TOOL
    local sanitizer
    if ! sanitizer=$(find_compute_sanitizer); then
        echo "SKIP: compute-sanitizer not found (PATH, \$CUDA_HOME, /usr/local/cuda, /opt/cuda)"
        return "$SKIP_RC"
    fi
    "$sanitizer" --version | tail -1
    shown "$sanitizer" --tool "$1" --error-exitcode 1 --target-processes all --print-limit 50 \
        "$PY" "${SHORT[@]}"
}

step_racecheck() {
    compute_sanitizer racecheck
}

step_memcheck() {
    # Without the caching allocator every tensor is its own allocation, so an access
    # past a tensor's end is outside any allocation and memcheck sees it.
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute_sanitizer memcheck
}

export -f shown step_env step_generate_check step_reused_event step_pytest_gpu step_overlap \
    step_demo_decode step_demo_eagle step_bench step_torch_sanitizer find_compute_sanitizer compute_sanitizer \
    step_racecheck step_memcheck

# name, default limit in seconds, sized from the 2026-11-27 H200 run's step times: they
# add up to 525 s, under the default budget, so a default run fits one 10-minute call
# with its figures (at most 30 s more) and the machine's margin. A step gets at most
# what is left of the budget: with larger limits (GPU_CHECK_LIMIT_<STEP>) the last
# steps may be reported "not run", to run alone (GPU_CHECK_STEPS) in a second call.
STEPS=(
    env 15
    generate-check 15
    reused-event 30
    pytest-gpu 130
    overlap 70
    demo-decode 35
    demo-eagle 35
    bench 60
    torch-sanitizer 30
    racecheck 75
    memcheck 30
)

# -- the runner --------------------------------------------------------------------------

START=$(date +%s)
SUMMARY="$RESULTS/summary.txt"
FAILED=0
RAN=0
declare -a LINES=()

selected() { # NAME
    [[ -z ${GPU_CHECK_STEPS:-} ]] && return 0
    [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]
}

run_step() { # NAME LIMIT
    local name=$1 limit=$2 var fn log status note rc began took left
    var="GPU_CHECK_LIMIT_$(tr 'a-z-' 'A-Z_' <<<"$name")"
    limit=${!var:-$limit}
    fn="step_${name//-/_}"
    log="$RESULTS/$name.log"
    left=$((START + BUDGET - $(date +%s)))
    ((limit > left)) && limit=$left
    RAN=$((RAN + 1))
    if ((left < 5)); then
        status=FAIL note="not run: the run's budget of ${BUDGET}s is spent"
        echo "$note" >"$log"
        took=0
    else
        echo "== $name (limit ${limit}s)"
        began=$(date +%s)
        # Arrays do not pass through the environment: hand them over as declarations.
        timeout --kill-after=10 "$limit" bash -c "$(declare -p RELAY SHORT); $fn" >"$log" 2>&1
        rc=$?
        took=$(($(date +%s) - began))
        note=$(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-110)
        if ((rc == 0)); then
            status=PASS
        elif ((rc == SKIP_RC)); then
            status=SKIP
        elif ((rc == 124 || rc == 137)); then
            status=FAIL note="timed out after ${limit}s${note:+; last line: $note}"
        else
            status=FAIL note="exit $rc${note:+; last line: $note}"
        fi
    fi
    [[ $status == FAIL ]] && FAILED=$((FAILED + 1))
    LINES+=("$(printf '%-4s  %-16s %4ss  %s.log  %s' "$status" "$name" "$took" "$name" "$note")")
    echo "   $status in ${took}s: $note"
}

for name in ${GPU_CHECK_STEPS:-}; do
    if [[ " ${STEPS[*]} " != *" $name "* ]]; then
        echo "GPU_CHECK_STEPS: no step '$name'; the steps are: $(printf '%s ' "${STEPS[@]}" | tr -s ' 0-9' ' ')" >&2
        exit 2
    fi
done

for ((i = 0; i < ${#STEPS[@]}; i += 2)); do
    selected "${STEPS[i]}" && run_step "${STEPS[i]}" "${STEPS[i + 1]}"
done

# The figures to record, from the logs and JSON of whatever steps ran
# (outside the budget: it only reads files).
timeout 30 "$PY" "$ROOT/scripts/gpu_figures.py" "$RESULTS" >"$RESULTS/figures.md" 2>&1 ||
    echo "(scripts/gpu_figures.py failed: see above)" >>"$RESULTS/figures.md"

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
    echo "relay GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ), ${GPU:-no GPU found}"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    grep -m1 '^python ' "$RESULTS/env.log" 2>/dev/null
    echo "took $(($(date +%s) - START))s of a ${BUDGET}s budget; logs in $RESULTS"
    echo
    printf '%s\n' "${LINES[@]}"
    echo
    if ((RAN == 0)); then
        echo "overall: FAIL (no step selected by GPU_CHECK_STEPS='${GPU_CHECK_STEPS:-}')"
    elif ((FAILED == 0)); then
        echo "overall: PASS"
    else
        echo "overall: FAIL ($FAILED of $RAN steps)"
    fi
    echo
    cat "$RESULTS/figures.md"
} >"$SUMMARY"
rm -rf "$HYPOTHESIS_STORAGE_DIRECTORY"
echo
cat "$SUMMARY"
((RAN > 0 && FAILED == 0))
