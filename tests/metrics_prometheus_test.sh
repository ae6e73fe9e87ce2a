#!/usr/bin/env bash
# A real scrape: Debian's Prometheus server scrapes a running `switchml switch --metrics-port`
# (and rank 0's `switchml worker --metrics-port`) every second while a 2-worker job runs on
# loopback; then the test reads back through Prometheus's HTTP API:
#   - every metric docs/operations.md lists (between its metrics:begin/end and
#     worker-metrics:begin/end markers) was stored, so the server parsed the exposition;
#   - the job's own series (label session="7"): 2 workers registered, completed rounds (and
#     256 elements each) up to what the switch itself prints at exit, an all-reduce count within
#     what the job ran;
#   - switch-wide counters after the job equal the switch's own: the datagrams received as it
#     prints them at exit; 2 session registrations answered OK.
# Skipped (77) where the prometheus package is not installed (scripts/setup.sh installs it).
# Usage: metrics_prometheus_test.sh SWITCHML_BINARY
set -euo pipefail
bin="${1:?usage: metrics_prometheus_test.sh SWITCHML_BINARY}"
docs="$(cd "$(dirname "$0")/.." && pwd)/docs/operations.md"
prom="$(command -v prometheus || true)"
if [ -z "$prom" ]; then
  echo "SKIP: no prometheus server (apt-get install prometheus; scripts/setup.sh does)"
  exit 77
fi
py=/usr/bin/python3
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$bin" switch --bind 127.0.0.1 --data-port 0 --control-port 0 --metrics-port 0 \
  --log-level warning >"$tmp/switch.log" 2>&1 &
switch_pid=$!
pids+=($switch_pid)
for _ in $(seq 100); do
  grep -q "metrics on" "$tmp/switch.log" && break
  sleep 0.1
done
control_port="$(grep -o 'control port [0-9]*' "$tmp/switch.log" | grep -o '[0-9]*$')" ||
  fail "the switch did not start"
switch_metrics="$(grep -o 'metrics on http://[^/]*' "$tmp/switch.log" | sed 's|.*http://||')"
worker_metrics_port="$(free_port)"
prom_port="$(free_port)"

cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: switchml-switch
    static_configs: [{targets: ["$switch_metrics"]}]
  - job_name: switchml-worker
    static_configs: [{targets: ["127.0.0.1:$worker_metrics_port"]}]
EOF
"$prom" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

api="http://127.0.0.1:$prom_port/api/v1"
# query EXPR: the first sample's value of an instant query ("" when none).
query() {
  curl -sf --get "$api/query" --data-urlencode "query=$1" |
    "$py" -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
# wait_for EXPR SECONDS: until the query has a sample.
wait_for() {
  for _ in $(seq $(($2 * 5))); do
    [ -n "$(query "$1" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "no sample of '$1' after $2 s"
}
wait_for 'up{job="switchml-switch"} == 1' 30

# The job: rank 0 first (the job exists with one worker registered), rank 1 once Prometheus has
# seen that, so the job is scraped from its start. About 5 s of all-reduces on loopback.
iterations=40
worker() {
  "$bin" worker --switch "127.0.0.1:$control_port" --workers 2 --session 7 --size 1M \
    --iterations $iterations --warmup 1 --quiet --report "$@"
}
# Rank 0 serves its metrics until Prometheus has scraped them after the job (a job on a fast
# machine is shorter than the scrape interval).
worker --rank 0 --metrics-port "$worker_metrics_port" --metrics-linger 60 >"$tmp/w0.out" \
  2>"$tmp/w0.log" &
w0=$!
pids+=($w0)
wait_for 'switchml_job_workers_registered{session="7"} == 1' 30
worker --rank 1 >"$tmp/w1.out" 2>"$tmp/w1.log" || fail "rank 1 failed"
wait "$w0" || fail "rank 0 failed"
wait_for 'last_over_time(switchml_worker_packets_sent_total[5m])' 30
# Its last scrape came after the job: the packets sent read back as rank 0 reports them.
scraped_sent="$(query 'last_over_time(switchml_worker_packets_sent_total[5m])')"
reported_sent="$(grep -o ' sent=[0-9]*' "$tmp/w0.out" | grep -o '[0-9]*$')"
[ -n "$reported_sent" ] && [ "${scraped_sent%.*}" = "$reported_sent" ] ||
  fail "Prometheus has rank 0 sending '$scraped_sent' packets; rank 0 says '$reported_sent'"

# After the job: let Prometheus scrape the idle switch once more, then stop the switch, which
# prints its counters.
sleep 2.5
received="$(query 'sum(switchml_switch_thread_packets_received_total)')"
[ "$(query 'switchml_control_calls_total{method="Session/UdpSession",code="OK"}')" = 2 ] ||
  fail "not 2 registrations answered OK"
kill -TERM "$switch_pid"
wait "$switch_pid" || fail "the switch failed"
printed="$(grep -o '^daemon: received [0-9]*' "$tmp/switch.log" | grep -o '[0-9]*$')"
[ -n "$printed" ] && [ "$printed" -gt 0 ] || fail "the switch printed no datagrams received"
[ "${received%.*}" = "$printed" ] ||
  fail "Prometheus has the switch receiving '$received' datagrams; the switch says $printed"

# The job's series, read back over the job's life (it has left the switch since).
registered="$(query 'max_over_time(switchml_job_workers_registered{session="7"}[5m])')"
[ "$registered" = 2 ] || fail "the job's registered workers read back as '$registered', not 2"
rounds="$(query 'max_over_time(switchml_job_slot_rounds_completed_total{session="7"}[5m])')"
elements="$(query 'max_over_time(switchml_job_elements_aggregated_total{session="7"}[5m])')"
# The switch's own count of the job's completed rounds, printed at exit (its closed jobs' table).
completed="$(sed -n '/^session 7:/,/^session /p' "$tmp/switch.log" | grep -o '^  completed *[0-9]*' |
  grep -o '[0-9]*$' | head -1)"
[ -n "$completed" ] || fail "the switch printed no completed rounds for session 7"
"$py" -c "import sys; r=float('$rounds' or 0); sys.exit(0 if 0 < r <= $completed else 1)" ||
  fail "the job's completed rounds read back as '$rounds' (the switch says $completed in all)"
"$py" -c "import sys; sys.exit(0 if float('$elements' or -1) == 256 * float('$rounds') else 1)" ||
  fail "elements aggregated '$elements' is not 256 per completed round ('$rounds')"
allreduces="$(query 'max_over_time(switchml_job_allreduces_total{session="7"}[5m])')"
"$py" -c "import sys; a=float('$allreduces' or 0); sys.exit(0 if 1 <= a <= $((iterations + 1)) else 1)" ||
  fail "the job's all-reduces read back as '$allreduces' (expected 1..$((iterations + 1)))"

# Every documented metric was stored (so the server parsed every one of them).
names="$(curl -sf "$api/label/__name__/values" | "$py" -c 'import json,sys; print("\n".join(json.load(sys.stdin)["data"]))')"
missing=()
for section in metrics worker-metrics; do
  documented="$(sed -n "/<!-- $section:begin -->/,/<!-- $section:end -->/p" "$docs" |
    grep -o '`\(switchml\|process\)_[a-z_]*`' | tr -d '`' | sort -u)"
  [ -n "$documented" ] || fail "no metrics listed in $docs between the $section markers"
  for m in $documented; do
    grep -qx "$m" <<<"$names" || missing+=("$m")
  done
done
[ ${#missing[@]} -eq 0 ] || fail "documented but never stored by Prometheus: ${missing[*]}"
echo "metrics_prometheus_test: Prometheus stored every documented metric; the job's counters and" \
  "the switch's ($received datagrams) read back as the workers report"
