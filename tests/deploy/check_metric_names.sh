#!/usr/bin/env bash
# Metric-name drift: every verifyd_* name that the alert rules and the Grafana dashboard use
# (less _bucket/_sum/_count) exists in a live /metrics scrape of a running verifyd, and the daemon
# exports exactly the names of plans/0003-service-metrics.md. Fails naming each drifted name.
# Usage: check_metric_names.sh <repo root> <verifyd> <fake_scheduler|none> <verifyctl|none>
set -euo pipefail
root=$1
verifyd=$2
fake_scheduler=$3
verifyctl=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

# The names of families the scrape in $1 declares (# TYPE lines), one a line.
exported_names() { awk '$1 == "#" && $2 == "TYPE" { print $3 }' "$1" | sort -u; }

# The verifyd_* names the files use, as family names.
used_names() {
  grep -ohE 'verifyd_[a-z0-9_]+' "$@" | sed -E 's/_(bucket|sum|count)$//' | sort -u
}

# Names of $1 (a list) missing from $2 (a list), one a line.
missing_from() { comm -23 <(sort -u <<<"$1") <(sort -u <<<"$2"); }

start_verifyd "$verifyd"
# Labelled families appear once a label set has been seen: drive real traffic first.
if [[ "$fake_scheduler" != none ]]; then
  drive_traffic "$fake_scheduler"
else
  "$verifyctl" --target="$VERIFYD_TARGET" stats || fail "verifyctl stats exited $?"
fi
scrape=$DEPLOY_TMP/metrics.txt
curl -fsS "http://$VERIFYD_METRICS_ADDR/metrics" >"$scrape"
exported=$(exported_names "$scrape")
echo "scrape: $(wc -l <<<"$exported") families, $(grep -vc '^#' "$scrape") samples"

# The check itself must be able to fail: a name nobody exports is reported.
[[ -n "$(missing_from "verifyd_no_such_metric_total" "$exported")" ]] || fail "the drift check cannot fail"

status=0
for file in deploy/prometheus/alerts.yml deploy/grafana/verifyd-dashboard.json; do
  used=$(used_names "$root/$file")
  [[ -n "$used" ]] || fail "$file uses no verifyd_* metric"
  missing=$(missing_from "$used" "$exported")
  if [[ -n "$missing" ]]; then
    echo "DRIFT: $file uses names the daemon does not export:" $missing >&2
    status=1
  else
    echo "$file: all $(wc -l <<<"$used") names exported"
  fi
done

# Label values the rules and dashboard select on.
for label in 'method="Verify"' 'code="OK"' 'result="failed"' 'result="done"'; do
  grep -q "^verifyd_[a-z_]*{[^}]*$label" "$scrape" || {
    echo "DRIFT: no exported sample carries $label" >&2
    status=1
  }
done

# The contract table of plans/0003 versus the scrape, both ways.
contract=$(grep -oE '^\| `verifyd_[a-z0-9_]+`' "$root/plans/0003-service-metrics.md" | tr -d '|` ' | sort -u)
[[ -n "$contract" ]] || fail "plans/0003-service-metrics.md lists no metric"
if [[ -n "$(missing_from "$contract" "$exported")" ]]; then
  echo "DRIFT: in plans/0003 but not exported:" "$(missing_from "$contract" "$exported" | tr '\n' ' ')" >&2
  status=1
fi
extra=$(missing_from "$(grep '^verifyd_' <<<"$exported")" "$contract")
if [[ -n "$extra" ]]; then
  echo "DRIFT: exported but not in plans/0003:" $extra >&2
  status=1
fi
if ((status != 0)); then
  echo "--- the scrape:" >&2
  cat "$scrape" >&2
  fail "metric names drifted"
fi
echo "plans/0003: all $(wc -l <<<"$contract") contract names exported, none extra"
stop_verifyd
echo "PASS"
