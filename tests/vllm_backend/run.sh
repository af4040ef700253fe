#!/usr/bin/env bash
# frost_vllm's tests against vLLM 0.32's real classes, on the CPU (tests/vllm_backend/). vLLM 0.32 pins
# torch 2.13.0 (this machine's) but transformers < 5.20 (frostc's tests take 5.23), so it gets a
# venv of its own: made once (~75 s, 2.1 GB; VLLM_VENV, default .vllm-venv), with vLLM and the
# small packages its attention classes import (not its CUDA kernels, triton or xformers), and
# frost_runtime from this tree. The sets they read are built by frostc's venv (.venv) first.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=${VLLM_VENV:-.vllm-venv}
if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import vllm, frost_vllm" 2>/dev/null; then
    python3 -m venv "$V"
    "$V/bin/pip" install -q torch==2.13.0
    "$V/bin/pip" install -q vllm==0.32.0 --no-deps
    "$V/bin/pip" install -q numpy==2.4.6 packaging==26.4 regex==2026.12.2 psutil==7.2.2 pydantic==2.14.4 \
        cbor2==6.3.0 pyzmq==27.3.0 urllib3==2.8.0 transformers==5.19.0 aiohttp==3.14.5 requests==2.34.2 \
        oss-harmony==0.0.11 openai==3.63.0 pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.2 msgspec==0.23.0 \
        cloudpickle==3.1.3 uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 fastapi==0.136.3 \
        partial-json-parser==0.2.1.1.post7 einops==0.8.2 llguidance==1.7.6 apache-tvm-ffi==0.1.11 \
        msgpack "cuda-bindings>=12.8" pytest
    "$V/bin/pip" install -q xgrammar==0.2.8 --no-deps
    "$V/bin/pip" install -q -e ./runtime --no-deps
fi
.venv/bin/python -m tests.vllm_sets
"$V/bin/python" -m pytest -q -p no:cacheprovider tests/vllm_backend "$@"
