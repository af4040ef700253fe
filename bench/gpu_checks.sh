#!/usr/bin/env bash
# The GPU machine's checks after a kernel or runtime change, one device call each (600 s at most):
#   bash bench/gpu_checks.sh tests    # the whole GPU suite, then compute-sanitizer on SANITIZE_ONLY
#   bash bench/gpu_checks.sh sanitize # transformers from .hfslim (it stays while the machine is warm: the next
#                                     # call carries tests/.built for `tests`, the two being over 64 MiB
#                                     # together), then compute-sanitizer on SANITIZE_ONLY (comma-separated
#                                     # pieces of labels) with each tool's time
#   bash bench/gpu_checks.sh verify   # one call when devices are scarce: the GPU suite, compute-sanitizer
#                                     # on SANITIZE_ONLY, and bench/serve.py's frostc rows (64 requests, profiled)
#   bash bench/gpu_checks.sh serve    # bench/serve.py: frostc, FlashAttention-4 (when a `mixed` call just
#                                     # installed it into /tmp/site) and frostc-fused, 64 and 256 requests;
#                                     # then bench/vllm_launch.py. Carry .hfslim, bench/.built/serve, bench/.built/vllm
#   bash bench/gpu_checks.sh sinks    # attention sinks: GPU cases, sanitizer targets, bench/sinks.py
#   bash bench/gpu_checks.sh http     # bench/serve_http.py run: transformers serve, frostc-fused and FlashAttention-4
#   bash bench/gpu_checks.sh soak     # bench/serve_http.py soak: 5 minutes at concurrency 64, cancellations
#   bash bench/gpu_checks.sh dims     # the new head dims (issue 44): their GPU cases, sanitizer groups d96 and
#                                     # d192, bench/sdpa.py's d96 and d192/128 rows (FA4 beside them when
#                                     # a `mixed` call just installed it into /tmp/site)
#   bash bench/gpu_checks.sh tiles    # bench/tile_trials.py's candidates (bench/.built/tiles/d{D}-*): each
#                                     # folder's bench/sdpa.py rows beside the chosen tiles' (FA4 too when staged)
#   bash bench/gpu_checks.sh decode   # bench/decode.py
#   bash bench/gpu_checks.sh model    # bench/model.py (add MODEL_ARGS="--compiled-model" to time that too)
#   bash bench/gpu_checks.sh mixed    # bench/mixed.py; FlashAttention-4 beside it when .peer/part2 is carried
#                                     # (right after .peer/part1/stage.sh); MIXED_BASELINE=DIR: a second
#                                     # run over an earlier build's plans
#   bash bench/gpu_checks.sh runtime  # a runtime-only candidate (RT=build/rt-NAME: a copy of its runtime/
#                                     # folder): transformers' continuous-batching GPU cases under it, then
#                                     # bench/serve.py's SERVE_ATTN rows at 64 requests, profiled, under
#                                     # main's runtime and under it (carry build and .hfslim)
#   bash bench/gpu_checks.sh cand     # kernel candidates side by side (bench/candidates.py build on the CPU
#                                     # machine; carry build and .hfslim): each one's bench/mixed.py rows,
#                                     # then its GPU cases beside its sanitizer targets
#   bash bench/gpu_checks.sh all      # one call for everything after a kernel change: the GPU suite (a
#                                     # process per file: bench/gpu_pytest.py) and compute-sanitizer
#                                     # (SANITIZE_ONLY) side by side, then bench/serve.py's
#                                     # SERVE_ATTN rows at 64 requests, profiled, in the time left (ALL_S);
#                                     # PYTEST_K: pytest's -k for every file (a changed kernel's cases)
# Packed, everything built fits one call beside .hfslim: `bash bench/gpu_checks.sh pack` on the CPU
# machine writes build/built.tar.xz (tests/.built and bench/.built, ~56 MiB raw, ~4 MiB packed); carry
# build and .hfslim; every mode unpacks it first.
# Build first on the CPU machine: python -m tests.gpu.build_plans; python bench/sanitize.py build;
# python bench/decode.py build; python bench/model.py build. Carry tests/.built, bench/.built and
# .hfslim (transformers' wheels without numpy: ../shared/tools/gpu-wheels). Logs go to $OUT.
set -u
export PYTHONPATH=runtime:. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
if [ "${1:-}" = pack ]; then
    mkdir -p build && tar -cJf build/built.tar.xz tests/.built bench/.built && ls -l build/built.tar.xz
    exit
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# transformers from the carried wheels (.hfslim); it stays installed while the machine is warm
install_transformers() {
    python3 -m pip install -q --no-index --find-links .hfslim transformers==5.23.0 2>&1 | grep -v WARNING | tail -3
}
if [ -f build/built.tar.xz ]; then
    tar -xJf build/built.tar.xz
fi
case "${1:-tests}" in
runtime)
    rt=${RT:?RT=build/rt-NAME: the candidate runtime folder}
    install_transformers
    PYTHONPATH=$rt:. timeout "${PYTEST_S:-200}" python -m pytest tests/gpu/test_hf_continuous.py -q \
        -p no:cacheprovider -rs > "$OUT/pytest-runtime.log" 2>&1
    echo "pytest ($rt) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-runtime.log" | tail -8
    for r in runtime "$rt"; do
        name=$(basename "$r")
        PYTHONPATH=$r:. timeout "${SERVE_S:-170}" python bench/serve.py run --requests 64 \
            --attn "${SERVE_ATTN:-frostc-fused,frostc-fused-e4m3}" --profile --md "$OUT/serve-$name.md" \
            > "$OUT/serve-$name.log" 2>&1
        echo "serve ($r) rc=$?"; grep -E "requests:|^\|" "$OUT/serve-$name.log" | cut -c1-300 | tail -8
    done
    ;;
cand)
    tar -xJf build/cand.tar.xz
    [ -d .hfslim ] && install_transformers
    python bench/candidates.py run 2>&1 | tee "$OUT/cand.txt" | grep -vE "^\[" | tail -60
    ;;
all)
    start=$(date +%s)
    install_transformers
    (timeout "${SANITIZE_S:-400}" python bench/sanitize.py run --only "${SANITIZE_ONLY:-}" > "$OUT/sanitize.txt" 2>&1
        echo "sanitize rc=$? in $(( $(date +%s) - start )) s" >> "$OUT/sanitize.txt") &
    # one process per test file, PYTEST_JOBS side by side: a kernel's fault costs its own file
    python bench/gpu_pytest.py --jobs "${PYTEST_JOBS:-4}" --timeout "${PYTEST_S:-400}" -k "${PYTEST_K:-}" \
        > "$OUT/pytest.txt" 2>&1
    echo "pytest rc=$? in $(( $(date +%s) - start )) s"; tail -40 "$OUT/pytest.txt"
    wait
    tail -8 "$OUT/sanitize.txt"; grep -E "^\| " "$OUT/sanitize.txt" | grep -vE "\| 0 \| 0 \| 0 \| ok \|" | head -20
    left=$(( ${ALL_S:-560} - ($(date +%s) - start) ))
    if [ "$left" -gt 90 ]; then
        timeout "$left" python bench/serve.py run --requests 64 --attn "${SERVE_ATTN:-frostc-fused,frostc-fused-e4m3}" \
            --profile --md "$OUT/serve.md" > "$OUT/serve.log" 2>&1
        echo "serve rc=$? ($left s left)"; grep -E "requests:|^\|" "$OUT/serve.log" | cut -c1-300 | tail -16
        # which kernels hold the attention time (in the output itself: files may not come back)
        grep -E "kernels among|top .* kernels" "$OUT/serve.md" | cut -c1-600
    fi
    # the device tool brings back a few files only: the per-file and per-shard logs in one
    (cd "$OUT" && tar -cJf logs.tar.xz pytest-*.log sanitize-*.log 2>/dev/null && rm -f pytest-*.log sanitize-*.log)
    ;;
tests)
    install_transformers
    timeout 330 python -m pytest tests/gpu -q -p no:cacheprovider -rs -s > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"
    grep -E "relative L2|logit|near tie|equal;" "$OUT/pytest.log" | head -20
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -15
    timeout 200 python bench/sanitize.py run --only "${SANITIZE_ONLY:-}" > "$OUT/sanitize.txt" 2>&1
    echo "sanitize rc=$?"; tail -30 "$OUT/sanitize.txt"
    # a control: the kernel filter instruments frostc's kernels (a filter that matches nothing
    # runs the same launches uninstrumented, faster)
    for filter in kns=frostc_ kns=matches_no_kernel; do
        start=$(date +%s%N)
        /usr/local/cuda/bin/compute-sanitizer --tool memcheck --kernel-name "$filter" \
            python bench/sanitize.py launch --plans bench/.built/sanitize --only mixed > "$OUT/control-$filter.log" 2>&1
        echo "memcheck $filter: $(( ($(date +%s%N) - start) / 1000000 )) ms, $(tail -1 "$OUT/control-$filter.log")"
    done
    ;;
sanitize)
    # carry .hfslim and bench/.built (bench/.built/sanitize)
    install_transformers
    start=$(date +%s)
    timeout "${SANITIZE_S:-400}" python bench/sanitize.py run --only "${SANITIZE_ONLY:-}" > "$OUT/sanitize.txt" 2>&1
    echo "sanitize rc=$? in $(( $(date +%s) - start )) s"; tail -40 "$OUT/sanitize.txt"
    ;;
verify)
    install_transformers
    timeout 250 python -m pytest tests/gpu -q -p no:cacheprovider -rs > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -15
    timeout 130 python bench/sanitize.py run --only "${SANITIZE_ONLY:-}" > "$OUT/sanitize.txt" 2>&1
    echo "sanitize rc=$?"; tail -12 "$OUT/sanitize.txt"
    timeout 170 python bench/serve.py run --requests 64 --attn frostc --profile --md "$OUT/serve.md" \
        > "$OUT/serve.log" 2>&1
    echo "serve rc=$?"; tail -25 "$OUT/serve.log"
    ;;
serve)
    install_transformers
    if [ -d /tmp/site ]; then
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
    # SERVE_ARGS: e.g. "--requests 64 --attn flash_attention_4,frostc-fused --kept" (a kept manager's call too)
    # shellcheck disable=SC2086
    timeout 480 python bench/serve.py run ${SERVE_ARGS:---requests 64,256 --attn frostc,flash_attention_4,frostc-fused} \
        --profile --md "$OUT/serve.md" > "$OUT/serve.log" 2>&1
    echo "serve rc=$?"; grep -E "requests:|^\|" "$OUT/serve.log" | cut -c1-300 | tail -16
    timeout 60 python bench/vllm_launch.py run --md "$OUT/vllm_launch.md" > "$OUT/vllm_launch.log" 2>&1
    echo "vllm_launch rc=$?"; tail -12 "$OUT/vllm_launch.log"
    ;;
sinks)
    # attention sinks (issue 44): their GPU cases, their sanitizer targets, their cost
    # (carry tests/.built, bench/.built/sanitize and bench/.built/sinks)
    timeout 200 python -m pytest tests/gpu/test_sdpa.py -q -p no:cacheprovider -rs -k sinks > "$OUT/pytest-sinks.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-sinks.log" | tail -8
    timeout 150 python bench/sanitize.py run --only sinks > "$OUT/sanitize-sinks.txt" 2>&1
    echo "sanitize rc=$?"; tail -8 "$OUT/sanitize-sinks.txt"
    timeout 200 python bench/sinks.py run --md "$OUT/sinks.md" > "$OUT/sinks.log" 2>&1
    echo "sinks rc=$?"; tail -14 "$OUT/sinks.log"
    ;;
http|soak)
    # transformers serve under streaming clients (bench/serve_http.py); carry .hfslim, .hfserve (the
    # serving extra's wheels) and bench/.built/serve; FlashAttention-4 joins when /tmp/site has it
    python3 -m pip install -q --no-index --find-links .hfslim --find-links .hfserve transformers==5.23.0 \
        fastapi uvicorn openai accelerate 2>&1 | grep -v WARNING | tail -3
    if [ -d /tmp/site ]; then
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
    if [ "$1" = http ]; then
        timeout 560 python bench/serve_http.py run --attn "${HTTP_ATTN:-frostc-fused,flash_attention_4}" \
            --md "$OUT/http.md" --json "$OUT/http.json" > "$OUT/http.log" 2>&1
        echo "http rc=$?"; grep -E "^\|" "$OUT/http.log" | tail -14; grep -E "^- " "$OUT/http.log" | tail -8
    else
        timeout 570 python bench/serve_http.py soak --attn frostc-fused --seconds "${SOAK_S:-300}" \
            --concurrency "${SOAK_C:-64}" --md "$OUT/soak.md" --json "$OUT/soak.json" > "$OUT/soak.log" 2>&1
        echo "soak rc=$?"; tail -30 "$OUT/soak.log"
    fi
    ;;
mixed)
    if [ -d .peer/part2 ]; then
        bash .peer/part2/install.sh > "$OUT/fa4-install.log" 2>&1; tail -1 "$OUT/fa4-install.log"
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
    timeout 280 python bench/mixed.py run --md "$OUT/mixed.md" --json "$OUT/mixed.json" > "$OUT/mixed.log" 2>&1
    echo "mixed rc=$?"; tail -30 "$OUT/mixed.log"
    if [ -n "${MIXED_BASELINE:-}" ]; then
        MIXED_PLANS=$MIXED_BASELINE timeout 250 python bench/mixed.py run --md "$OUT/mixed-baseline.md" \
            --json "$OUT/mixed-baseline.json" > "$OUT/mixed-baseline.log" 2>&1
        echo "baseline rc=$?"; tail -30 "$OUT/mixed-baseline.log"
    fi
    ;;
dims)
    # carry tests/.built, bench/.built (sdpa plans and sanitize)
    if [ -d /tmp/site ]; then
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
    timeout 200 python -m pytest tests/gpu -q -p no:cacheprovider -rs -k "d96 or d192 or phi3" > "$OUT/pytest-dims.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-dims.log" | tail -10
    for group in d96 d192; do
        timeout 120 python bench/sanitize.py run --only $group > "$OUT/sanitize-$group.txt" 2>&1
        echo "sanitize $group rc=$?"; tail -14 "$OUT/sanitize-$group.txt"
    done
    timeout 200 python bench/sdpa.py run --head-dims 96,192 --md "$OUT/sdpa-dims.md" > "$OUT/sdpa-dims.log" 2>&1
    echo "sdpa rc=$?"; tail -14 "$OUT/sdpa-dims.log"
    ;;
tiles)
    # carry bench/.built (the chosen tiles' sdpa plans and bench/.built/tiles)
    if [ -d /tmp/site ]; then
        export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    fi
    # folders d{D}-{candidate} or d{D}v{DV}-{candidate}: bench/sdpa.py's rows of q's head dim D
    for dims in $(ls bench/.built/tiles | sed 's/^d\([0-9]*\)[-v].*/\1/' | sort -u); do
        timeout 120 python bench/sdpa.py run --head-dims "$dims" --md "$OUT/tiles-d$dims-chosen.md" > "$OUT/tiles-d$dims-chosen.log" 2>&1
        echo "d$dims chosen rc=$?"; grep -E "^\| [0-9]" "$OUT/tiles-d$dims-chosen.log"
        for folder in bench/.built/tiles/d"$dims"[-v]*; do
            name=$(basename "$folder")
            SDPA_PLANS=$folder timeout 120 python bench/sdpa.py run --head-dims "$dims" --md "$OUT/tiles-$name.md" \
                > "$OUT/tiles-$name.log" 2>&1
            echo "$name rc=$?"; grep -E "^\| [0-9]" "$OUT/tiles-$name.log"
        done
    done
    ;;
decode)
    timeout 560 python bench/decode.py run --md "$OUT/decode.md" --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1
    echo "decode rc=$?"; tail -25 "$OUT/decode.log"
    ;;
model)
    install_transformers
    # shellcheck disable=SC2086
    timeout 560 python bench/model.py run --md "$OUT/model.md" --json "$OUT/model.json" ${MODEL_ARGS:-} \
        > "$OUT/model.log" 2>&1
    echo "model rc=$?"; tail -30 "$OUT/model.log"
    ;;
*)
    echo "usage: bash bench/gpu_checks.sh tests|sanitize|verify|serve|sinks|http|soak|mixed|dims|tiles|decode|model" >&2; exit 2
    ;;
esac
