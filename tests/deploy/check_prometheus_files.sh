#!/usr/bin/env bash
# promtool on the shipped Prometheus files: config and rules are valid, and the alert unit tests
# (alerts_test.yml) pass. Also checks the Grafana dashboard's structure. Exit 77 = skipped.
# Usage: check_prometheus_files.sh <repo root>
set -euo pipefail
root=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

command -v promtool >/dev/null || {
  echo "SKIPPED: promtool not found (Debian package prometheus; deploy/install_deps.sh installs it)"
  exit 77
}

# promtool resolves rule_files relative to the file that names them: check copies side by side.
cp "$root/deploy/prometheus/prometheus.yml" "$root/deploy/prometheus/alerts.yml" \
  "$here/alerts_test.yml" "$DEPLOY_TMP/"
promtool check config "$DEPLOY_TMP/prometheus.yml"
promtool check rules "$DEPLOY_TMP/alerts.yml"
promtool test rules "$DEPLOY_TMP/alerts_test.yml"

# Every alert in the rules has a unit test and an operator section in deploy/README.md.
alerts=$(grep -oE '^ *- alert: [A-Za-z]+' "$root/deploy/prometheus/alerts.yml" | awk '{print $3}')
for alert in $alerts; do
  grep -q "alertname: $alert\$" "$here/alerts_test.yml" || fail "alert $alert has no test in alerts_test.yml"
  grep -q "^### $alert\$" "$root/deploy/README.md" ||
    fail "alert $alert has no '### $alert' section in deploy/README.md"
done
echo "every alert ($(echo $alerts | wc -w)) has a unit test and a README section"

# The dashboard: valid JSON, a datasource template variable, and every panel and query on it.
dashboard=$root/deploy/grafana/verifyd-dashboard.json
if command -v python3 >/dev/null; then
  python3 - "$dashboard" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = {v["name"]: v for v in d["templating"]["list"]}
assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus", \
    "templating: no prometheus datasource variable"
ds = {"type": "prometheus", "uid": "${datasource}"}
cells = set()
exprs = 0
for p in d["panels"]:
    g = p["gridPos"]
    assert g["x"] + g["w"] <= 24, f'panel {p["title"]!r}: x + w = {g["x"] + g["w"]} must be <= 24'
    for cx in range(g["x"], g["x"] + g["w"]):
        for cy in range(g["y"], g["y"] + g["h"]):
            assert (cx, cy) not in cells, f'panel {p["title"]!r} overlaps another at ({cx}, {cy})'
            cells.add((cx, cy))
    if p["type"] == "row":
        continue
    assert p["datasource"] == ds, f'panel {p["title"]!r}: datasource {p["datasource"]} must be {ds}'
    assert p["targets"], f'panel {p["title"]!r} has no query'
    for t in p["targets"]:
        assert t["datasource"] == ds and t["expr"].strip(), f'panel {p["title"]!r}: bad target {t}'
        exprs += 1
print(f"dashboard: {len(d['panels'])} panels, {exprs} queries, all on the datasource variable, no overlap")
PY
else
  echo "COULD NOT RUN: dashboard structure check (needs python3); only its datasource variable was grepped"
  grep -q '"type": "datasource"' "$dashboard" || fail "dashboard has no datasource template variable"
fi
echo "PASS"
