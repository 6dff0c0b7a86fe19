#!/usr/bin/env bash
# Start a Docker daemon in the background if none is answering (no systemd needed).
# Idempotent: does nothing when `docker info` already works.
# Log: /tmp/dockerd.log   PID file: /tmp/dockerd.pid
set -euo pipefail

LOG=${DOCKERD_LOG:-/tmp/dockerd.log}
PIDFILE=${DOCKERD_PIDFILE:-/tmp/dockerd.pid}
TIMEOUT=${DOCKERD_TIMEOUT:-60}

if docker info >/dev/null 2>&1; then
    echo "dockerd: already running"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "dockerd: not installed (apt-get install -y docker.io)" >&2
    exit 1
fi

# A dockerd we started earlier may still be initialising: wait for it instead of starting a second one.
if [[ -s "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    PID=$(cat "$PIDFILE")
    echo "dockerd: pid $PID exists but is not answering yet; waiting"
else
    rm -f "$PIDFILE"  # stale
    echo "dockerd: starting (log: $LOG)"
    # dockerd writes $PIDFILE itself (and refuses to start if another instance owns it).
    nohup dockerd --pidfile "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
    PID=$!
fi

for ((i = 0; i < TIMEOUT; i++)); do
    if docker info >/dev/null 2>&1; then
        echo "dockerd: ready after ${i}s"
        exit 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "dockerd: process exited; last log lines:" >&2
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    sleep 1
done

echo "dockerd: did not answer 'docker info' within ${TIMEOUT}s; see $LOG" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
