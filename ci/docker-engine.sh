#!/usr/bin/env bash
# A private Docker engine for the Docker launcher (docs/guides/docker.md), apart from any system one:
# its own data root, exec root, socket and pidfile under $SPECCHAOS_DOCKER_DIR (default /tmp/specchaos-docker).
#
#   ci/docker-engine.sh start    install docker.io when dockerd is missing (apt-get, as root), start the engine
#                                (an engine already running there is reused) and print the one line
#                                DOCKER_HOST=unix://DIR/docker.sock   -> export "$(ci/docker-engine.sh start)"
#                                (export, not eval: the harness's processes must see it in their environment)
#   ci/docker-engine.sh stop     stop it (SIGTERM, then SIGKILL after 20 s) and unmount what it leaves mounted
#   ci/docker-engine.sh status   say whether it runs (exit 0) or not (exit 1)
#
# The engine: no iptables, no default bridge (containers use the host's network; the launcher binds vLLM to
# loopback), storage driver overlay2 (vfs where overlay2 does not work). Its log: DIR/dockerd.log.
set -euo pipefail
DIR="${SPECCHAOS_DOCKER_DIR:-/tmp/specchaos-docker}"
SOCK="$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
HOST="unix://$SOCK"

running() {   # the engine of this directory answers
  [ -S "$SOCK" ] && DOCKER_HOST="$HOST" timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

engine_pid() {
  [ -f "$PIDFILE" ] && pid="$(cat "$PIDFILE")" && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install() {
  command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "docker-engine: dockerd is missing and cannot be installed here (needs root and apt-get): install docker.io" >&2
    exit 1
  fi
  echo "docker-engine: installing docker.io (apt-get)" >&2
  { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null; } || {
    echo "docker-engine: apt-get install docker.io failed" >&2; exit 1; }
}

start() {
  mkdir -p "$DIR"
  if running; then echo "DOCKER_HOST=$HOST"; return 0; fi
  install
  if pid="$(engine_pid)"; then   # a stale engine of this directory that does not answer
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$SOCK" "$PIDFILE"
  local driver=overlay2 try
  for try in 1 2; do
    # setsid: the engine outlives this script and its caller's terminal
    setsid dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver="$driver" \
      --data-root "$DIR/data" --exec-root "$DIR/exec" -H "$HOST" --pidfile "$PIDFILE" \
      >>"$LOG" 2>&1 < /dev/null &
    local t=0
    while [ $t -lt 300 ]; do   # 30 s
      if running; then echo "DOCKER_HOST=$HOST"; return 0; fi
      kill -0 $! 2>/dev/null || break
      sleep 0.1; t=$((t + 1))
    done
    kill -KILL $! 2>/dev/null || true
    if [ "$driver" = overlay2 ] && grep -q -i "overlay" "$LOG"; then
      echo "docker-engine: overlay2 does not work here; trying vfs" >&2
      driver=vfs; continue
    fi
    break
  done
  echo "docker-engine: the engine did not answer on $SOCK within 30 s; last lines of $LOG:" >&2
  tail -n 15 "$LOG" >&2 || true
  exit 1
}

stop() {
  local pid
  if pid="$(engine_pid)"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # the engine leaves its network namespace (and, killed, container mounts) mounted under its exec root
  if [ -d "$DIR/exec" ]; then
    grep -o " $DIR/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  fi
  rm -f "$SOCK" "$PIDFILE"
  echo "docker-engine: stopped ($DIR)" >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "docker-engine: running, DOCKER_HOST=$HOST"; else echo "docker-engine: not running ($DIR)"; exit 1; fi ;;
  *) echo "docker-engine: unknown command '${1:-}' (start, stop, status)" >&2; exit 2 ;;
esac
