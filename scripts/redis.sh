#!/usr/bin/env bash
# The Redis the high-availability tests use as the CeleryExecutor's broker: 127.0.0.1:6379, on
# loopback only (no password; nothing outside this machine can reach it). Installs Debian's
# redis-server when it is missing and starts it when it is down. Idempotent; needs root (as on CI)
# or sudo to install.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi
if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis: installing Debian's redis-server" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
    # Started directly (no systemd in containers), daemonized, bound to loopback only, nothing on disk.
    $SUDO redis-server --bind 127.0.0.1 --port 6379 --protected-mode yes --daemonize yes \
        --save "" --appendonly no --logfile /tmp/iris-redis.log
    for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && break; sleep 0.5; done
fi
redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG
echo "redis: ready on 127.0.0.1:6379 ($(redis-server --version | cut -d' ' -f3))" >&2
