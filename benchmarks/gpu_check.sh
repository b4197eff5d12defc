#!/usr/bin/env bash
# The GPU check: on one NVIDIA GPU, in under 8 minutes, measure the machine (`ntp profile`), run a
# 1.1B-parameter model for real at full size (`ntp validate --full-size --backend nccl`) against the
# cost model's step time and memory, and set the profile's block times beside the analytical ones.
#
#   bash benchmarks/gpu_check.sh [--device cuda|cpu] [--out DIR]
#
# --device cuda (default): TinyLlama-1.1B (benchmarks/gpu_check/tinyllama-1.1b.json): its blocks
#   profiled in bf16 at 1,024 tokens, the model run at full size in float64 on nccl; writes
#   profiles/<gpu>.json (+ .cluster.json) in the repo: commit them.
# --device cpu: the same steps at toy size on gloo (benchmarks/gpu_check/tiny.json), a dry run for
#   CI (tests/benchmarks/test_gpu_check.py) that keeps the script working where there is no GPU.
#
# Every step is timed and its output kept under DIR (default gpu-check-<device>): DIR/<step>.out
# (its JSON) and DIR/<step>.err; DIR/gpu_check.json holds every figure; the summary table is printed.
# Exit 0 when every step ran (a poor prediction is reported, not failed), 1 when a step failed (the
# steps that need it are skipped), 2 for a bad argument or a machine that cannot run the check (no
# CUDA torch, say).
set -euo pipefail

DEVICE=cuda
OUT=""
die() { echo "error: $1; usage: bash benchmarks/gpu_check.sh [--device cuda|cpu] [--out DIR]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device|--out) [[ $# -ge 2 ]] || die "$1 needs a value"
            if [[ "$1" == --device ]]; then DEVICE="$2"; else OUT="$2"; fi; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || die "--device must be cuda or cpu, not '$DEVICE'"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-gpu-check-$DEVICE}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, installed or not
export PYTHONUNBUFFERED=1

# The sizes of each device. cuda: a 1.1B model, 2 sequences of 1,024 tokens per step in 2
# micro-batches of 1, 8 steps: in float64 the run holds ~50 GB of an H200, and the one-process
# reference, which trains both sequences at once after it, ~65 GB; the profile measures that
# model's blocks at that micro-batch. cpu: a toy of the same architecture.
if [[ "$DEVICE" == cuda ]]; then
    MODEL="$ROOT/benchmarks/gpu_check/tinyllama-1.1b.json"
    SEQ=1024 MICRO=1 BATCH=2 STEPS=8 BACKEND=nccl TOTAL_S=480 QUICK=()
else
    MODEL="$ROOT/benchmarks/gpu_check/tiny.json"
    SEQ=64 MICRO=2 BATCH=8 STEPS=4 BACKEND=gloo TOTAL_S=150 QUICK=(--quick)
fi
# The GPU's profile is bf16, the precision plans train in (and the analytical model's); the CPU's
# is float32 (bf16 kernels on a CPU are slow emulations). The validate run is float64 on both, so
# that its exactness check (1e-9) measures the executor and not rounding: with std-0.1 weights a
# 2048-wide model's attention saturates and a small gradient is a difference of large terms; in
# bf16, 22 layers of width 512 already err by 0.19 on the last layer's query gradient, above
# validate's bf16 tolerance of 0.1, and float32 would sit near its 1e-5. validate measures the
# run's own blocks in float64 on the spot for its prediction (the profile's are another dtype).
RUN_DTYPE=float64
PROFILE_DTYPE=$([[ "$DEVICE" == cuda ]] && echo bfloat16 || echo float32)

# A Python that has torch (and, for cuda, sees a GPU): $PYTHON, the repo's .venv, then the PATH's;
# each is asked once, and says why not when it cannot.
PROBE='import torch, typer, pydantic, rich
gpu = torch.cuda.is_available()
print("ok" if gpu or "'"$DEVICE"'" == "cpu" else f"torch {torch.__version__}, CUDA build {torch.version.cuda}, torch.cuda UNAVAILABLE")'
PY="" WHY=""
for c in "${PYTHON:-}" "$ROOT/.venv/bin/python" python3 python; do
    [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 || continue
    said="$("$c" -c "$PROBE" 2>&1 | tail -n 1)" || true
    if [[ "$said" == ok ]]; then PY="$c"; break; fi
    WHY="$WHY  $c: $said"$'\n'
done
if [[ -z "$PY" ]]; then
    echo "error: no Python here can run the $DEVICE check; each one tried says:" >&2
    printf '%s' "$WHY" >&2
    [[ "$DEVICE" == cuda ]] && echo "  (a CPU-only torch cannot run it: install a CUDA torch, or run --device cpu)" >&2
    exit 2
fi

DEADLINE=$(( $(date +%s) + TOTAL_S ))
STEPS_TSV="$OUT/steps.tsv"
printf 'step\tseconds\trc\n' > "$STEPS_TSV"
FAILED=0

# step NAME NEEDS CMD...: run CMD with what is left of the total budget, its stdout in DIR/NAME.out
# and stderr in DIR/NAME.err, its time and exit code in DIR/steps.tsv; skipped (rc -1) unless every
# step named in NEEDS (comma-separated, or -) ran, or when the budget is spent.
OK=","
step() {
    local name="$1" needs="$2"; shift 2
    local left=$(( DEADLINE - $(date +%s) )) rc=0 t0 t1 ms why="" n
    for n in ${needs//,/ }; do
        [[ "$n" == - || "$OK" == *",$n,"* ]] || why="it needs step $n"
    done
    (( left > 0 )) || why="the ${TOTAL_S} s budget is spent"
    if [[ -n "$why" ]]; then
        printf '%s\t0.000\t-1\n' "$name" >> "$STEPS_TSV"
        echo "== $name: skipped ($why)" >&2
        return 0
    fi
    echo "== $name (at most ${left} s): $*" >&2
    t0=$(date +%s%N)
    timeout --kill-after=10 "$left" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" || rc=$?
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    printf '%s\t%d.%03d\t%d\n' "$name" $(( ms / 1000 )) $(( ms % 1000 )) "$rc" >> "$STEPS_TSV"
    echo "   $name: $(( ms / 1000 )).$(printf '%03d' $(( ms % 1000 ))) s, exit $rc" >&2
    if (( rc == 0 )); then
        OK="$OK$name,"
    else
        FAILED=1
        echo "== $name FAILED (exit $rc$( (( rc == 124 )) && echo ': out of time')); the end of its output:" >&2
        tail -n 5 "$OUT/$name.out" "$OUT/$name.err" >&2
    fi
}
NTP=("$PY" -m ntp_planner)
CHECK=("$PY" "$ROOT/benchmarks/gpu_check.py")

# a. the machine: GEMMs, this model's blocks at the run's shape, attention, passes (one GPU: no collectives)
step profile - "${NTP[@]}" profile --device "$DEVICE" --nproc 1 --tp 1 --model "$MODEL" --dtype "$PROFILE_DTYPE" --seq-len "$SEQ" \
    --micro-batches "$MICRO" ${QUICK[@]+"${QUICK[@]}"} -o "$OUT/profile.json" --cluster-out "$OUT/profile.cluster.json" --json
# b. a plan for this very machine (the profile's cluster file: one GPU), then that plan run at full size
step plan profile "${NTP[@]}" estimate -m "$MODEL" -c "$OUT/profile.cluster.json" -n 1 --tp 1 --pp 1 --micro-batch "$MICRO" \
    --seq-len "$SEQ" --global-batch "$BATCH" --profile "$OUT/profile.json" -o "$OUT/plan.json" --json
step validate profile,plan "${NTP[@]}" validate "$OUT/plan.json" --full-size --backend "$BACKEND" --dtype "$RUN_DTYPE" --steps "$STEPS" \
    --profile "$OUT/profile.json" --timeout 300 --json
# c. the profile's blocks against the analytical model's on this GPU
step blocks profile "${CHECK[@]}" blocks --profile "$OUT/profile.json" --model "$MODEL" \
    --out "$OUT/blocks.json"

# profiles/<gpu>.json: the profile under its GPU's name, for `ntp plan --profile`; commit it (cuda only:
# a dry run leaves the repo as it was and keeps its copy under DIR/profiles)
if [[ -s "$OUT/profile.json" ]]; then
    SLUG="$("${CHECK[@]}" slug "$OUT/profile.json")"
    DEST="$OUT/profiles"
    [[ "$DEVICE" == cuda ]] && DEST="$ROOT/profiles"
    mkdir -p "$DEST" "$OUT/profiles"
    cp "$OUT/profile.json" "$DEST/$SLUG.json"
    cp "$OUT/profile.cluster.json" "$DEST/$SLUG.cluster.json"
    [[ "$DEST" != "$OUT/profiles" ]] && cp "$OUT/profile.json" "$OUT/profiles/$SLUG.json"
    echo "profile written to $DEST/$SLUG.json" >&2
fi

# d. one table and DIR/gpu_check.json with every figure
"${CHECK[@]}" summary "$OUT" --device "$DEVICE" || FAILED=1
exit $(( FAILED ? 1 : 0 ))
