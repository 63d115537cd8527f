#!/usr/bin/env bash
# Set up the real LiteLLM proxy that tests/gateways/test_litellm.py runs against.
#
# Creates $HOPLINE_LITELLM_DIR/venv, a venv SEPARATE from hopline's own: litellm[proxy] 1.106.12
# pins rich<14 (hopline's .venv resolves rich 15) and brings ~110 packages (boto3, azure, mcp,
# granian, prisma's client...) that nothing else in hopline needs. Installs hopline with its
# `litellm` extra (the same pin) into it, editable, so `litellm --config` finds
# `hopline.middleware.litellm.proxy_handler` from this checkout.
# Newer litellm releases are not used: 1.108+ pin litellm-proxy-extras / litellm-proxy builds
# that the package index does not serve (pip cannot resolve `litellm[proxy]` for them).
# Idempotent: a finished venv (stamp file naming the version) is kept; hopline is re-installed.
#
# Usage: HOPLINE_LITELLM_DIR=/path/to/litellm-env bash .ci/litellm-setup.sh
set -euo pipefail
: "${HOPLINE_LITELLM_DIR:?set HOPLINE_LITELLM_DIR (where the LiteLLM venv goes)}"
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=$HOPLINE_LITELLM_DIR/venv
VERSION=1.106.12   # keep in step with the `litellm` extra in pyproject.toml
STAMP=$VENV/.hopline-litellm-$VERSION
PYTHON=${HOPLINE_LITELLM_PYTHON:-python3.11}
t_all=$SECONDS
mkdir -p "$HOPLINE_LITELLM_DIR"

pip_install() {  # quiet pip, minus the warnings about index folders this machine lacks
  "$VENV/bin/pip" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

if [[ ! -f $STAMP ]]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pip_install install -q --upgrade pip
  pip_install install -q "litellm[proxy]==$VERSION"
  touch "$STAMP"
  echo "litellm-setup: venv built in $((SECONDS - t_all)) s"
else
  echo "litellm-setup: venv present ($VENV), kept"
fi
# hopline itself, editable, with the same pin (a no-op for litellm once the venv is built)
pip_install install -q -e "$REPO[litellm]"
# LITELLM_LOCAL_MODEL_COST_MAP: use the cost map shipped in the wheel (no fetch from the internet)
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import litellm.proxy.proxy_server, hopline.middleware.emit" \
  || { echo "litellm-setup: the proxy or hopline does not import in $VENV" >&2; exit 1; }
echo "litellm-setup: done in $((SECONDS - t_all)) s; venv $(du -sh "$VENV" | cut -f1)"
