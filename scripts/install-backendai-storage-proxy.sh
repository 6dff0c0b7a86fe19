#!/usr/bin/env bash
# Install Backend.AI's own storage proxy (backend.ai-storage-proxy 23.9.10, Python 3.11) in
# .venv-bai-storage, for benchmarks/storage.py --backendai-proxy only (it runs beside ours
# in the same benchmark run). Not used by CI or the tests.
# The Python comes from pyenv when it has 3.11.7, else from PATH, else `uv python install`.
# Idempotent: an existing, working venv is kept. Fails loudly when it cannot install.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${BAI_STORAGE_VENV:-.venv-bai-storage}
version=23.9.10
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
    "import importlib.metadata as m; assert m.version('backend.ai-storage-proxy') == '$version'; \
import ai.backend.storage.server" 2>/dev/null; then
  echo "[install] backend.ai-storage-proxy $version already in $venv"
  exit 0
fi
py=""
for cand in "${PYTHON311:-}" "$(pyenv root 2>/dev/null)/versions/3.11.7/bin/python3.11" \
            "$(command -v python3.11 2>/dev/null || true)"; do
  if [ -n "$cand" ] && [ -x "$cand" ]; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "[install] Python 3.11 (uv python install 3.11)"
  uv python install 3.11
  py=$(uv python find 3.11)
fi
echo "[install] backend.ai-storage-proxy $version in $venv (Python: $py)"
rm -rf "$venv"
uv venv -q --python "$py" "$venv"
# yarl 1.9.4: later yarl releases break aiohttp 3.8 (the 23.09 line's pin).
uv pip install -q --python "$venv/bin/python" "backend.ai-storage-proxy==$version" "yarl==1.9.4"
"$venv/bin/python" -m ai.backend.storage.server --help >/dev/null
echo "[install] ok: $venv/bin/python -m ai.backend.storage.server"
