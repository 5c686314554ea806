# Sourced by scripts/demo, scripts/compare and scripts/sweep-ranged: a local registry for them.

# A TCP port on 127.0.0.1 that is free now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_registry WORK STORAGE: starts Debian's docker-registry on a free port of 127.0.0.1, its
# storage in STORAGE (keep it on tmpfs, or the registry's disk reads are what a benchmark times),
# its configuration and log in WORK. Sets `registry_pid` as soon as it runs (for the caller's
# cleanup trap) and `registry` (host:port) once /v2/ answers; if it never does, prints the log
# and fails.
start_registry() {
  local work=$1 storage=$2 port
  port=$(free_port)
  cat > "$work/registry.yml" <<YML
version: 0.1
log: { level: warn, accesslog: { disabled: true } }
storage: { filesystem: { rootdirectory: $storage }, delete: { enabled: true } }
http: { addr: 127.0.0.1:$port }
YML
  docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
  if ! curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null; then
    cat "$work/registry.log" >&2
    return 1
  fi
  registry=127.0.0.1:$port
}
