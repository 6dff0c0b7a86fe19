#!/usr/bin/env bash
# Build the local kernel images without pulling anything from a registry.
#
#   images/build.sh [--force] [--force-base]
#
#   (a) backendai/debian-base:bookworm  - debootstrap'ed Debian 12 minbase, `docker import`ed.
#                                         Built only if missing (or --force-base).
#   (b) backendai/python-kernel:latest  - images/kernel/Dockerfile. Built only if missing, if
#                                         its ai.backend.build-hash label differs from the hash
#                                         of images/kernel/* + base image id, or with --force
#                                         (which also disables the docker layer cache).
#
# Needs root, docker (daemon running; scripts/start-dockerd.sh is tried otherwise),
# debootstrap (only when the base image is missing), HTTP access to the Debian mirror (debootstrap,
# and apt-get in the kernel image for openssh: the base image's sources.list names it) and
# HTTPS access to PyPI. Env overrides: DEBIAN_MIRROR, BASE_IMAGE, KERNEL_IMAGE, CACHE_DIR.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
KERNEL_DIR=$HERE/kernel
BASE_IMAGE=${BASE_IMAGE:-backendai/debian-base:bookworm}
KERNEL_IMAGE=${KERNEL_IMAGE:-backendai/python-kernel:latest}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE_DIR=${CACHE_DIR:-/var/cache/backendai}
BASE_PACKAGES=python3,python3-venv,ca-certificates,bash,procps,tini
HOST_CA=/etc/ssl/certs/ca-certificates.crt

FORCE=0
FORCE_BASE=0
for arg in "$@"; do
    case $arg in
        --force) FORCE=1 ;;
        --force-base) FORCE=1; FORCE_BASE=1 ;;
        -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { echo "[build.sh] $*"; }
die() { echo "[build.sh] ERROR: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker CLI not found (apt-get install -y docker.io)"
if ! docker info >/dev/null 2>&1; then
    log "docker daemon not answering; trying scripts/start-dockerd.sh"
    bash "$REPO/scripts/start-dockerd.sh" || die "no docker daemon"
fi

mkdir -p "$CACHE_DIR"
# One build at a time on this host.
exec 9>"$CACHE_DIR/build.lock"
flock 9

image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

# ---------------------------------------------------------------- (a) base image
build_base() {
    [[ $EUID -eq 0 ]] || die "building $BASE_IMAGE needs root (debootstrap)"
    command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install -y debootstrap)"
    local root t0=$SECONDS
    root=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$root'" EXIT
    mkdir -p "$CACHE_DIR/debs"
    log "debootstrap minbase bookworm from $DEBIAN_MIRROR (+ $BASE_PACKAGES)"
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" \
            --cache-dir="$CACHE_DIR/debs" bookworm "$root" "$DEBIAN_MIRROR" \
            >"$CACHE_DIR/debootstrap.log" 2>&1; then
        tail -n 30 "$CACHE_DIR/debootstrap.log" >&2
        die "debootstrap failed (full log: $CACHE_DIR/debootstrap.log)"
    fi
    # Slim down, and keep docs out of later apt installs too.
    cat >"$root/etc/dpkg/dpkg.cfg.d/01-nodoc" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
    cat >"$root/etc/apt/apt.conf.d/01-slim" <<'CFG'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
CFG
    cat >"$root/etc/apt/sources.list" <<SRC
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$root"/usr/share/{man,info}/* "$root"/var/lib/apt/lists/* \
           "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
           "$root"/var/log/*.log "$root"/dev/* "$root"/tmp/* "$root"/run/*
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
    log "importing $BASE_IMAGE ($(du -sh "$root" | cut -f1))"
    tar --numeric-owner -C "$root" -c . | docker import \
        -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' \
        -m "debootstrap --variant=minbase bookworm + $BASE_PACKAGES" \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$root"
    trap - EXIT
    log "base image built in $((SECONDS - t0))s"
}

if [[ -z $(image_id "$BASE_IMAGE") || $FORCE_BASE -eq 1 ]]; then
    build_base
else
    log "$BASE_IMAGE: present, skipped"
fi
BASE_ID=$(image_id "$BASE_IMAGE")
[[ -n $BASE_ID ]] || die "$BASE_IMAGE missing after build"

# ---------------------------------------------------------------- (b) kernel image
# The hub's body limit, shared with the image (images/kernel/backendai_kernel_bodies.py).
BODYLIMIT=$REPO/jupyterhub_backendai/common/bodylimit.py
# The page config that turns JupyterLab's news plugin off, shared with the hub's local
# kernels (jupyterhub_backendai/share/jupyter-config).
NO_NEWS=$REPO/jupyterhub_backendai/share/jupyter-config/labconfig/page_config.json
# Hash of every file under images/kernel (names + contents) plus the base image id, so a
# rebuilt base also triggers a kernel rebuild.
HASH=$(
    cd "$KERNEL_DIR"
    { find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; echo "base $BASE_ID"
      sha256sum <"$BODYLIMIT"; sha256sum <"$NO_NEWS"; } \
        | sha256sum | cut -c1-64
)
CURRENT=$(docker image inspect -f '{{index .Config.Labels "ai.backend.build-hash"}}' "$KERNEL_IMAGE" 2>/dev/null || true)

if [[ $FORCE -eq 0 && $CURRENT == "$HASH" ]]; then
    log "$KERNEL_IMAGE: up to date (build-hash ${HASH:0:12}), skipped"
    exit 0
fi
if [[ $FORCE -eq 1 ]]; then reason="--force"
elif [[ -z $CURRENT ]]; then reason="missing"
else reason="build-hash ${CURRENT:0:12} -> ${HASH:0:12}"; fi
log "building $KERNEL_IMAGE ($reason)"

CTX=$(mktemp -d "$CACHE_DIR/context.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$CTX'" EXIT
cp -a "$KERNEL_DIR"/. "$CTX"/
cp "$BODYLIMIT" "$CTX/backendai_bodylimit.py"
cp "$NO_NEWS" "$CTX/no-news-page_config.json"
# The host CA bundle lets pip work behind TLS-intercepting proxies; it is used in the
# builder stage only and does not end up in the final image.
if [[ -r $HOST_CA ]]; then cp "$HOST_CA" "$CTX/build-ca.crt"
else docker run --rm "$BASE_IMAGE" cat /etc/ssl/certs/ca-certificates.crt >"$CTX/build-ca.crt"; fi

t0=$SECONDS
# Legacy builder: works with Debian's docker.io without the buildx plugin.
NO_CACHE=()
[[ $FORCE -eq 1 ]] && NO_CACHE=(--no-cache)
DOCKER_BUILDKIT=0 docker build --network host "${NO_CACHE[@]}" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --label ai.backend.build-hash="$HASH" \
    -t "$KERNEL_IMAGE" "$CTX" || die "docker build failed"
rm -rf "$CTX"
trap - EXIT
# Drop superseded (now untagged) kernel images; images still used by containers are kept.
docker image prune -f --filter label=ai.backend.build-hash >/dev/null || true
log "$KERNEL_IMAGE built in $((SECONDS - t0))s ($(docker image inspect -f '{{.Size}}' "$KERNEL_IMAGE" | numfmt --to=iec))"
