#!/usr/bin/env bash
# End to end: a real Prometheus server, started on the shipped scrape config and rules (rewritten to
# a 1 s interval and the test daemon's metrics port), scrapes a running verifyd while the fake
# scheduler drives traffic; Prometheus's HTTP query API must then hold the Verify request counter and
# every Verify latency bucket exactly as the daemon exports them, evaluate every rule without error,
# and accept every dashboard query.
# Usage: prometheus_e2e.sh <repo root> <verifyd> <fake_scheduler>
set -euo pipefail
root=$1
verifyd=$2
fake_scheduler=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

command -v prometheus >/dev/null || {
  echo "SKIPPED: prometheus not found (Debian package prometheus; deploy/install_deps.sh installs it)"
  exit 77
}

start_verifyd "$verifyd"

# --- the shipped config, pointed at this daemon ----------------------------------------------
cfg=$DEPLOY_TMP/prometheus
mkdir -p "$cfg"
cp "$root/deploy/prometheus/alerts.yml" "$cfg/"
sed -E -e 's/(scrape_interval|evaluation_interval): 15s/\1: 1s/' -e 's/scrape_timeout: 5s/scrape_timeout: 1s/' \
  -e "s/127\.0\.0\.1:9464\]/$VERIFYD_METRICS_ADDR]/" \
  -e '/127\.0\.0\.1:(946[5-9]|947[0-9])\]/,+1d' \
  "$root/deploy/prometheus/prometheus.yml" >"$cfg/prometheus.yml"
[[ $(grep -c -- '- targets:' "$cfg/prometheus.yml") -eq 1 ]] && grep -q "$VERIFYD_METRICS_ADDR" "$cfg/prometheus.yml" ||
  fail "could not rewrite prometheus.yml to one target at $VERIFYD_METRICS_ADDR:$(cat "$cfg/prometheus.yml")"
if command -v promtool >/dev/null; then promtool check config "$cfg/prometheus.yml" >/dev/null; fi

for attempt in 1 2 3; do
  prom=127.0.0.1:$(pick_port)
  daemon_start prometheus --config.file="$cfg/prometheus.yml" \
    --storage.tsdb.path="$DEPLOY_TMP/tsdb-$attempt" --web.listen-address="$prom" --log.level=warn \
    >"$DEPLOY_TMP/prometheus-$attempt.log" 2>&1
  prom_pid=$DAEMON_PID
  wait_http "http://$prom/-/ready" 30 "$prom_pid" && break
  kill -KILL "$prom_pid" 2>/dev/null || true
  daemon_reap "$prom_pid" || true
  cat "$DEPLOY_TMP/prometheus-$attempt.log" >&2
  ((attempt < 3)) || fail "prometheus did not become ready"
done
echo "prometheus pid $prom_pid on $prom"

prom_query() { curl -fsS -G --max-time 5 "http://$prom/api/v1/query" --data-urlencode "query=$1"; }
# The value of the first sample of an instant query, or "absent".
prom_value() {
  local v
  v=$(prom_query "$1" | grep -oE '"value":\[[^]]*\]' | head -1 | sed -E 's/.*,"([^"]*)"\]$/\1/')
  echo "${v:-absent}"
}
same_number() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a == b + 0 && b == a + 0) }'; }
# Polls `prom_value $1` up to $3 seconds until it equals $2.
wait_value() {
  local got
  for _ in $(seq $(($3 * 5))); do
    got=$(prom_value "$1")
    [[ "$got" != absent ]] && same_number "$got" "$2" && return 0
    sleep 0.2
  done
  fail "Prometheus has $1 = $got, the daemon exports $2"
}

wait_value 'up{job="verifyd"}' 1 20
targets=$(curl -fsS "http://$prom/api/v1/targets")
[[ $(grep -o '"health":"up"' <<<"$targets" | wc -l) -eq 1 ]] || fail "want exactly one healthy target: $targets"
echo "Prometheus scrapes verifyd at $VERIFYD_METRICS_ADDR (up = 1)"

before=$(prom_value 'sum(verifyd_rpc_requests_total{method="Verify"})')
[[ "$before" == absent ]] && before=0

drive_traffic "$fake_scheduler"

scrape=$DEPLOY_TMP/metrics.txt
curl -fsS "http://$VERIFYD_METRICS_ADDR/metrics" >"$scrape"
verify_total=$(sum_samples "$scrape" verifyd_rpc_requests_total 'method="Verify"')
verify_count=$(sum_samples "$scrape" verifyd_rpc_duration_seconds_count 'method="Verify"')
[[ "$verify_total" != absent ]] && awk -v n="$verify_total" -v b="$before" 'BEGIN { exit !(n > b) }' ||
  fail "the daemon's Verify counter did not rise: $before -> $verify_total"
same_number "$verify_count" "$verify_total" ||
  fail "daemon: Verify histogram count $verify_count != Verify requests $verify_total"

# The counter rose in Prometheus to exactly the daemon's value once the next scrape lands.
wait_value 'sum(verifyd_rpc_requests_total{method="Verify"})' "$verify_total" 20
echo "Verify requests: $before -> $verify_total in Prometheus"
wait_value 'sum(verifyd_rpc_duration_seconds_count{method="Verify"})' "$verify_count" 5

# Every bucket of the Verify latency histogram, as the daemon exports it.
buckets=0
while read -r le value; do
  wait_value "sum(verifyd_rpc_duration_seconds_bucket{method=\"Verify\",le=\"$le\"})" "$value" 5
  buckets=$((buckets + 1))
done < <(awk '$1 ~ /^verifyd_rpc_duration_seconds_bucket\{/ && $1 ~ /method="Verify"/ {
           match($1, /le="[^"]*"/); print substr($1, RSTART + 4, RLENGTH - 5), $2 }' "$scrape")
((buckets == 19)) || fail "want 18 latency buckets + Inf for Verify, the daemon exports $buckets"
inf=$(prom_value 'sum(verifyd_rpc_duration_seconds_bucket{method="Verify",le="+Inf"})')
same_number "$inf" "$verify_count" || fail "le=+Inf bucket $inf != count $verify_count"
p99=$(prom_value 'histogram_quantile(0.99, sum by (le) (verifyd_rpc_duration_seconds_bucket{method="Verify"}))')
awk -v q="$p99" 'BEGIN { exit !(q + 0 > 0 && q + 0 <= 5) }' || fail "Verify p99 from Prometheus = $p99, want (0, 5] s"
echo "Verify latency: all $buckets buckets match, $verify_count samples, p99 = $p99 s"

# The rules load and evaluate without error on live data.
rules=$(grep -c -- '- alert:' "$root/deploy/prometheus/alerts.yml")
for _ in $(seq 50); do
  state=$(curl -fsS "http://$prom/api/v1/rules")
  [[ $(grep -o '"health":"ok"' <<<"$state" | wc -l) -eq $rules ]] && break
  sleep 0.2
done
grep -q '"health":"err"' <<<"$state" && fail "a rule fails to evaluate: $state"
[[ $(grep -o '"health":"ok"' <<<"$state" | wc -l) -eq $rules ]] || fail "want $rules rules healthy: $state"
echo "alerts.yml: all $rules rules evaluate"

# Every dashboard query is valid PromQL on this server (Grafana's variables filled in).
queries=0
with_data=0
while IFS= read -r expr; do
  expr=${expr//\$__rate_interval/1m}
  expr=${expr//\$instance/.*}
  answer=$(prom_query "$expr") || fail "dashboard query rejected: $expr"
  grep -q '"status":"success"' <<<"$answer" || fail "dashboard query failed: $expr: $answer"
  grep -q '"value":' <<<"$answer" && with_data=$((with_data + 1))
  queries=$((queries + 1))
done < <(grep -oE '"expr": "([^"\\]|\\.)*"' "$root/deploy/grafana/verifyd-dashboard.json" |
  sed -E 's/^"expr": "//; s/"$//; s/\\"/"/g; s/\\\\/\\/g')
((queries > 0)) || fail "no dashboard query found"
echo "dashboard: $queries queries valid, $with_data with data"

daemon_stop "$prom_pid" || fail "prometheus exited $? on SIGTERM"
stop_verifyd
echo "PASS"
