#!/usr/bin/env bash
# A local Prefect setup for hermes-batch, in one command:
#   Prefect server (UI on http://127.0.0.1:4200) -> work pool 'hermes' -> `prefect deploy --all`
#   -> the zombie-run automation -> the demo model server on :8808 -> a worker in the foreground.
# Each part runs in a process group of its own, so losing one takes no other down: a worker that
# dies (killed, crashed) is started again, and the server and the model server keep running.
# Ctrl-C stops the worker and whatever else this script started; a server or model server
# that was already running is reused and left alone.
#
#   bash deployments/prefect/up.sh              # everything, with the bundled demo model server
#   bash deployments/prefect/up.sh --no-mock    # real endpoints only: export the API key first
#
# Environment: PREFECT_API_URL (default http://127.0.0.1:4200/api), HERMES_API_KEY /
# OPENROUTER_API_KEY / OPENAI_API_KEY (passed on to the runs by the worker), HERMES_MOCK_PORT (8808).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO=$(pwd)
MOCK=1
for arg in "$@"; do
  case "$arg" in
    --no-mock) MOCK=0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg (try --help)" >&2; exit 2 ;;
  esac
done

export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:4200/api}
export PREFECT_SERVER_ANALYTICS_ENABLED=false
POOL=hermes
MOCK_PORT=${HERMES_MOCK_PORT:-8808}
LOGS="$REPO/data/prefect-logs"
mkdir -p "$LOGS"
PY=${PYTHON:-python3}

if [[ "$PREFECT_API_URL" =~ ^https?://([^:/]+):([0-9]+)/api/?$ ]]; then
  HOST=${BASH_REMATCH[1]}; PORT=${BASH_REMATCH[2]}
else
  echo "PREFECT_API_URL must look like http://HOST:PORT/api (got $PREFECT_API_URL)" >&2; exit 2
fi

# Job control: each process started here gets its own process group, so Ctrl-C reaches only this
# script, which then stops them once each, in order. (Without it, bash starts background jobs
# with SIGINT ignored, and a Prefect worker then ignores its first SIGINT/SIGTERM.)
set -m
SERVICES=()
WORKER=""
stop() {  # stop the process group PID: TERM, up to 30 s, then KILL
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
  trap - EXIT INT TERM
  set +e
  # the worker first, while the server still answers it; then the services
  if [[ -n "$WORKER" ]]; then echo "stopping the worker..."; stop "$WORKER"; fi
  for pid in "${SERVICES[@]}"; do stop "$pid"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Run a command with SIGINT at its default, even when this script was started with it ignored
# (nohup, a background job): a Prefect worker stops gracefully only on a SIGINT/SIGTERM it can see.
with_sigint() { "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' "$@"; }
answers() { "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" >/dev/null 2>&1; }

echo "== sandbox image"
"$PY" -m hermes.sandbox.image ensure

echo "== Prefect server at $PREFECT_API_URL"
if answers "$PREFECT_API_URL/health"; then
  echo "already running: reusing it"
else
  # its UI calls the API from the browser: tell it this port, whichever (Prefect reads these, not --port)
  PREFECT_UI_API_URL="$PREFECT_API_URL" PREFECT_SERVER_API_PORT="$PORT" \
    "$PY" -m prefect server start --host "$HOST" --port "$PORT" --analytics-off >"$LOGS/server.log" 2>&1 &
  SERVICES+=($!)
  echo -n "starting (log: $LOGS/server.log) "
  for _ in $(seq 180); do
    answers "$PREFECT_API_URL/health" && break
    kill -0 "${SERVICES[-1]}" 2>/dev/null || { echo; tail -20 "$LOGS/server.log"; exit 1; }
    echo -n .; sleep 1
  done
  answers "$PREFECT_API_URL/health" || { echo; echo "the server did not answer in 180 s" >&2; exit 1; }
  echo " up"
fi

echo "== work pool '$POOL'"
if "$PY" -m prefect work-pool inspect "$POOL" >/dev/null 2>&1; then
  echo "exists"
else
  "$PY" -m prefect work-pool create "$POOL" --type process
fi

echo "== deployments (prefect.yaml)"
# Wide enough that rich does not cut the deployment ids printed after "successfully created".
COLUMNS=250 "$PY" -m prefect --no-prompt deploy --all | grep -E "successfully created|Error|error" || true

echo "== automations (deployments/prefect/automations.yaml)"
if "$PY" -m prefect automation inspect hermes-batch-crash-silent-runs >/dev/null 2>&1; then
  echo "exist"
else
  "$PY" -m prefect automation create --from-file deployments/prefect/automations.yaml
fi

if [[ $MOCK == 1 ]]; then
  echo "== demo model server on 127.0.0.1:$MOCK_PORT (the batch-run deployment's default base_url)"
  if answers "http://127.0.0.1:$MOCK_PORT/health"; then
    echo "already running: reusing it"
  else
    "$PY" -m mockllm --port "$MOCK_PORT" >"$LOGS/mock-llm.log" 2>&1 &
    SERVICES+=($!)
  fi
elif [[ -z "${HERMES_API_KEY:-}${OPENROUTER_API_KEY:-}${OPENAI_API_KEY:-}" ]]; then
  echo "warning: no HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY in this environment;" \
       "runs against a real endpoint will fail with 401 unless they name an api_key_secret" >&2
fi

cat <<EOF

== ready
  UI:          http://$HOST:$PORT   (Deployments > batch-run > Run > Custom run)
  other shell: export PREFECT_API_URL=$PREFECT_API_URL
               prefect deployment run 'batch-run/batch-run' --watch
  outputs:     $REPO/data/<run_name>/trajectories.jsonl
  guide:       deployments/prefect/README.md
Starting the worker (Ctrl-C stops it and what this script started)...

EOF
# The worker in a loop: one that dies is started again, and nothing else is stopped. (A flow run
# its death orphaned carries on and reports to the server; one that died with it is marked
# Crashed by the automation and resumes with Retry.)
while true; do
  with_sigint "$PY" -m prefect worker start --pool "$POOL" &
  WORKER=$!
  code=0
  wait "$WORKER" || code=$?
  WORKER=""
  echo "== the worker exited ($code); the server and the model server keep running." \
       "Starting it again in 5 s (Ctrl-C stops everything)" >&2
  sleep 5
done
