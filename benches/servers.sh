# Servers under test for the benches/*.sh scripts: free loopback ports, waiting until a
# server listens, and stopping exactly the server processes the calling script started.
# Sourced, never run: `source benches/servers.sh` after `set -euo pipefail`.
#
# The caller sets `out` (the folder of the server logs, `$out/NAME.log`) before calling
# wait_port, starts each server in the background and passes its `$!` to `started`, and
# runs stop_servers when a phase ends and on exit (`trap stop_servers EXIT`, or its own
# cleanup calling it). Nothing here stops a process by name, only by the PIDs it was given.

# Exports each NAME=value argument as a setting; anything else ends the script.
export_settings() { # "$@"
  local arg
  for arg in "$@"; do
    case $arg in
      *=*) export "${arg?}" ;;
      *) echo "${0##*/}: unknown argument $arg (settings are NAME=value)" >&2; exit 1 ;;
    esac
  done
}

# PIDs of the servers this script started and has not stopped yet.
pids=()

# Prints a TCP port free on 127.0.0.1 right now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Remembers a server process this script started, for stop_servers.
started() { # pid
  pids+=("$1")
}

# Waits up to 10 s until 127.0.0.1:PORT accepts connections; fails at once if PID exits.
wait_port() { # port pid name
  local script=${0##*/}
  for _ in $(seq 1 200); do
    if ! kill -0 "$2" 2>/dev/null; then
      echo "$script: $3 exited before listening (log: $out/$3.log)" >&2
      return 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "$script: $3 not listening on port $1 after 10 s" >&2
  return 1
}

# Stops one process this script started (if it still runs) and waits for it.
stop_pid() { # pid (may be empty)
  if [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; then
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
  fi
}

# Stops every server passed to `started` (all signalled first, then waited for).
stop_servers() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
