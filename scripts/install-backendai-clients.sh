#!/usr/bin/env bash
# Install Backend.AI's official clients (the `backend.ai` CLI) for tests/test_backendai_client.py,
# each in its own virtual environment: backend.ai-client 23.9.10 in .venv-bai23 (Python 3.11)
# and 26.9.6 in .venv-bai26 (Python 3.13).
# Each Python comes from pyenv when it has one, else from `uv python install`.
# Idempotent: an existing, working venv is kept. Fails loudly when it cannot install.
set -euo pipefail
cd "$(dirname "$0")/.."

# install_client VENV CLIENT_VERSION PYTHON_MINOR PYENV_VERSION [EXTRA_PIN ...]
install_client() {
  local venv=$1 version=$2 minor=$3 pyenv_version=$4
  shift 4
  if [ -x "$venv/bin/backend.ai" ] && "$venv/bin/python" -c \
      "import importlib.metadata as m; assert m.version('backend.ai-client') == '$version'" \
      2>/dev/null; then
    echo "[install] backend.ai-client $version already in $venv"
    return 0
  fi
  local py="" cand override="PYTHON${minor//./}"
  for cand in "${!override:-}" "$(pyenv root 2>/dev/null)/versions/$pyenv_version/bin/python$minor" \
              "$(command -v "python$minor" 2>/dev/null || true)"; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then py=$cand; break; fi
  done
  if [ -z "$py" ]; then
    echo "[install] Python $minor (uv python install $minor)"
    uv python install "$minor"
    py=$(uv python find "$minor")
  fi
  echo "[install] backend.ai-client $version in $venv (Python: $py)"
  rm -rf "$venv"
  uv venv -q --python "$py" "$venv"
  uv pip install -q --python "$venv/bin/python" "backend.ai-client==$version" "$@"
  "$venv/bin/backend.ai" --help >/dev/null
}

install_client "${BAI23_VENV:-.venv-bai23}" 23.9.10 3.11 3.11.7 "yarl==1.9.4" "blessed==1.20.0"
install_client "${BAI26_VENV:-.venv-bai26}" 26.9.6 3.13 3.13.0
