#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian bookworm machine (as root):
# Docker engine, PostgreSQL, Redis, etcd, Chromium, debootstrap, nginx (system packages),
# the pinned Python environment in .venv, configurable-http-proxy (npm, pinned by
# package-lock.json), a running dockerd and the kernel image.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
# openssh-client: ssh/sftp into a session's published sshd (tests/test_ssh_port.py).
# btrfs-progs: btrfs volumes (storageproxy/btrfs.py, tests/test_btrfs.py makes one on a loop device).
# nginx-light: the app front (jupyterhub_backendai/appfront.py, tests/test_service_ports.py).
# docker-registry: the distribution registry the image tests push to and agents pull from
# (tests/registry.py: loopback, htpasswd auth, TLS; docs/images.md).
# lxcfs: kernels' /proc as their cgroup sees it (agent/backends/lxcfs.py; tests/test_agent.py
# mounts one of its own).
# socat: the multi-node tests' namespaced engines reach the test registry on their own
# loopback (tests/swarm_nodes.py).
# iproute2: the browser tests' own network namespace (tests/chromium.py) and the multi-node
# tests' (tests/swarm_nodes.py).
# python3 (Debian's): an interpreter outside /root that an unprivileged kernel user can run
# (tests/test_attacks_agent.py runs a hub on it, installed from this checkout).
pkgs=(docker.io debootstrap postgresql redis-server etcd-server etcd-client psmisc openssh-client
      btrfs-progs docker-registry socat
      nginx-light python3 lxcfs iproute2)
# npm: configurable-http-proxy below, and binder/postBuild in tests/test_binder.py
# (only when missing: a NodeSource nodejs brings its own npm).
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}" chromium; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install] apt: ${missing[*]}"
  apt-get update -qq
  # chromium without recommends: no desktop stack on a headless CI machine
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
  apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
  echo "[install] uv"
  "$PY" -m pip install -q "uv==0.13.9" || "$PY" -m pip install -q uv
fi
if [ ! -x .venv/bin/python ]; then
  uv venv -q --python "$PY" .venv
fi
echo "[install] python packages (requirements/ci.txt)"
uv pip install -q --python .venv/bin/python -r requirements/ci.txt
uv pip install -q --python .venv/bin/python --no-deps -e .
bash scripts/install-backendai-clients.sh  # the official backend.ai CLI (tests/test_backendai_client.py)

echo "[install] configurable-http-proxy (npm ci)"
if [ ! -x node_modules/.bin/configurable-http-proxy ]; then
  npm ci --silent --no-audit --no-fund
fi

bash scripts/start-dockerd.sh
bash images/build.sh
