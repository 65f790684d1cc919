#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests and the systemd units, and that every daemon flag the
# bundle uses exists. Prints each check it could not run and why.
# Usage: check_manifests.sh <repo root> [verifyd|none] [verifyctl|none]
set -euo pipefail
root=$1
verifyd=${2:-none}
verifyctl=${3:-none}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
k8s=$root/deploy/k8s
systemd=$root/deploy/systemd
not_run=()

# --- Kubernetes -------------------------------------------------------------------------------

# The shipped per-GPU files are exactly what render.sh writes for 8-GPU nodes.
mkdir "$DEPLOY_TMP/render"
bash "$k8s/render.sh" 8 "$DEPLOY_TMP/render"
for f in daemonset.yaml resourceclaimtemplate.yaml service.yaml servicemonitor.yaml; do
  diff -u "$k8s/$f" "$DEPLOY_TMP/render/$f" || fail "deploy/k8s/$f differs from render.sh 8: rerun it"
done
bash "$k8s/render.sh" 0 "$DEPLOY_TMP/render" 2>/dev/null && fail "render.sh accepted 0 GPUs"
echo "k8s: daemonset/resourceclaimtemplate/service/servicemonitor equal render.sh 8"

# Every resource of the kustomization exists, and each document names its apiVersion, kind and
# metadata.name, without tabs (YAML forbids them in indentation).
resources=$(awk '/^resources:/ { on = 1; next } on && /^  - / { print $2; next } on && /^[^ ]/ { on = 0 }' \
  "$k8s/kustomization.yaml")
[[ -n "$resources" ]] || fail "kustomization.yaml lists no resources"
for r in $resources; do
  [[ -f "$k8s/$r" ]] || fail "kustomization.yaml: resource $r does not exist"
  ! grep -qP '\t' "$k8s/$r" || fail "$r contains a tab"
  awk -v file="$r" '
    function check() {
      if (doc && !(api && kind && name)) {
        printf "%s: document %d lacks apiVersion, kind or metadata.name\n", file, doc > "/dev/stderr"
        bad = 1
      }
    }
    /^---/ { check(); doc++; api = kind = name = meta = 0; next }
    /^[^#]/ && !doc { doc = 1 }
    /^apiVersion: [a-z.\/0-9]+$/ { api = 1 }
    /^kind: [A-Z][A-Za-z]+$/ { kind = 1 }
    /^metadata:/ { meta = 1; next }
    meta && /^  name: [a-z0-9-]+$/ { name = 1 }
    /^[a-z]/ && !/^metadata:/ { meta = 0 }
    END { check(); exit bad }' "$k8s/$r" || fail "$r is not a well-formed manifest"
done
echo "k8s: $(echo $resources | wc -w) resources, each with apiVersion, kind, metadata.name"

ds=$k8s/daemonset.yaml
containers=$(grep -cE '^        - name: verifyd-gpu[0-9]+$' "$ds" || true)
((containers >= 1)) || fail "daemonset: no verifyd container"
# GPUs come from the pod's one claim, which every container (the daemons and the scheduler)
# references, so they share the same GPUs (plans/0018); no device-plugin request may split them.
claim_refs=$(grep -cE '^              - name: gpus$' "$ds" || true)
((claim_refs == containers + 1)) ||
  fail "daemonset: $claim_refs containers reference the GPU claim (want the $containers daemons and the scheduler)"
! grep -q 'nvidia.com/gpu:' "$ds" || fail "daemonset: a device-plugin GPU request would give containers different GPUs"
grep -q 'resourceClaimTemplateName: verifyd-gpus' "$ds" || fail "daemonset: the pod does not claim verifyd-gpus"
grep -q "count: $containers\$" "$k8s/resourceclaimtemplate.yaml" ||
  fail "resourceclaimtemplate: the claim's count is not the $containers GPUs"
grep -q 'strategy: MPS' "$k8s/resourceclaimtemplate.yaml" || fail "resourceclaimtemplate: GPUs not shared through MPS"
for i in $(seq 0 $((containers - 1))); do
  grep -qE -- "^            - --device=$i\$" "$ds" || fail "daemonset: no daemon serves --device=$i"
done
# Port names: unique in the pod, at most 15 characters (IANA service name).
names=$(grep -oE 'name: (grpc|metrics)-gpu[0-9]+' "$ds" | awk '{print $2}')
dups=$(sort <<<"$names" | uniq -d)
[[ -z "$dups" ]] || fail "daemonset: duplicate port names: $dups"
while read -r n; do ((${#n} <= 15)) || fail "daemonset: port name $n longer than 15"; done <<<"$names"
# The probes hit a gRPC container port; the Service targets container ports; the ServiceMonitor
# scrapes Service ports.
grpc_ports=$(grep -A1 -E 'name: grpc-gpu[0-9]+$' "$ds" | grep -oE 'containerPort: [0-9]+' | awk '{print $2}')
probe_ports=$(grep -A1 -E '^ +grpc:$' "$ds" | grep -oE 'port: [0-9]+' | awk '{print $2}' | sort -u)
[[ $(wc -l <<<"$probe_ports") -eq $containers ]] || fail "daemonset: want one gRPC probe port per container"
for p in $probe_ports; do grep -qx "$p" <<<"$grpc_ports" || fail "daemonset: probe port $p is no grpc containerPort"; done
for p in $(grep -oE 'targetPort: [a-z0-9-]+' "$k8s/service.yaml" | awk '{print $2}'); do
  grep -qx "$p" <<<"$names" || fail "service: targetPort $p is no container port of the daemonset"
done
svc_ports=$(grep -oE '^    - name: [a-z0-9-]+' "$k8s/service.yaml" | awk '{print $3}')
for p in $(grep -oE '^    - port: [a-z0-9-]+' "$k8s/servicemonitor.yaml" | awk '{print $3}'); do
  grep -qx "$p" <<<"$svc_ports" || fail "servicemonitor: port $p is not a port of the Service"
done
# Every $(VAR) in the container args is defined: by the ConfigMap or the container's env.
defined=$(
  grep -oE '^  VERIFYD_[A-Z_]+:' "$k8s/configmap.yaml" | tr -d ' :'
  grep -oE -- '- name: VERIFYD_[A-Z_]+' "$ds" | awk '{print $3}'
)
for v in $(grep -oE '\$\([A-Z_]+\)' "$ds" | tr -d '$()' | sort -u); do
  grep -qx "$v" <<<"$defined" || fail "daemonset: \$($v) is neither in the ConfigMap nor in env"
done
grep -q 'emptyDir:' "$ds" || fail "daemonset: the socket volume must be an emptyDir"
echo "k8s: $containers verifyd containers, one shared MPS GPU claim, ports, probes, Service, ServiceMonitor and variables consistent"

if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  for r in $resources; do
    python3 -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))' "$k8s/$r" ||
      fail "$r is not valid YAML"
  done
  echo "k8s: every manifest parses as YAML (python3 yaml)"
else
  not_run+=("YAML parse of the manifests (no python3 yaml module)")
fi

if command -v kubectl >/dev/null; then
  kubectl kustomize "$k8s" >"$DEPLOY_TMP/kustomized.yaml" || fail "kubectl kustomize deploy/k8s failed"
  echo "k8s: kubectl kustomize renders $(grep -c '^kind:' "$DEPLOY_TMP/kustomized.yaml") objects"
  if kubectl apply --dry-run=client -f "$DEPLOY_TMP/kustomized.yaml" >"$DEPLOY_TMP/kubectl.log" 2>&1; then
    echo "k8s: kubectl apply --dry-run=client passes"
  elif grep -qE 'connection refused|unable to recognize|no such host|failed to download openapi|Unable to connect' \
    "$DEPLOY_TMP/kubectl.log"; then
    not_run+=("kubectl apply --dry-run=client (needs an API server for discovery; none reachable)")
  else
    cat "$DEPLOY_TMP/kubectl.log" >&2
    fail "kubectl apply --dry-run=client rejected the manifests"
  fi
else
  not_run+=("kubectl kustomize and kubectl apply --dry-run=client (kubectl not installed)")
fi

# --- systemd ----------------------------------------------------------------------------------

# systemd-analyze needs the ExecStart binaries to exist: point a temp copy at the built ones.
if command -v systemd-analyze >/dev/null; then
  units=$DEPLOY_TMP/units
  mkdir "$units"
  daemon_path=/bin/true
  ctl_path=/bin/true
  [[ "$verifyd" == none ]] || daemon_path=$verifyd
  [[ "$verifyctl" == none ]] || ctl_path=$verifyctl
  # The MPS control daemon is not on a machine without NVIDIA's driver: /bin/true stands in.
  for f in verifyd@.service verifyd-compact@.service verifyd-compact@.timer verifyd-mps@.service; do
    sed -e "s|/usr/local/bin/verifyd |$daemon_path |" -e "s|/usr/local/bin/verifyctl |$ctl_path |" \
      -e "s|/usr/bin/nvidia-cuda-mps-control -d|/bin/true|" "$systemd/$f" >"$units/$f"
  done
  grep -q "$daemon_path" "$units/verifyd@.service" || fail "ExecStart of verifyd@.service not found"
  (cd "$units" && systemd-analyze verify verifyd@0.service verifyd-compact@0.service \
    verifyd-compact@0.timer verifyd-mps@0.service) >"$DEPLOY_TMP/verify.log" 2>&1 || {
    cat "$DEPLOY_TMP/verify.log" >&2
    fail "systemd-analyze verify rejected the units"
  }
  # Unknown keys and sections are only warnings to systemd-analyze; here they fail.
  if grep -E 'verifyd' "$DEPLOY_TMP/verify.log"; then
    fail "systemd-analyze verify warned about the units"
  fi
  echo "systemd: systemd-analyze verify passes (verifyd=$daemon_path, verifyctl=$ctl_path)"
  [[ "$verifyd" != none ]] || not_run+=("systemd unit against the real verifyd binary (not built)")
else
  not_run+=("systemd-analyze verify (systemd not installed)")
fi

# --- flags ------------------------------------------------------------------------------------

# Every --flag the bundle passes to verifyd, and every flag row of the README, is one the daemon
# knows (absl spells them with underscores; the daemon accepts dashes).
if [[ "$verifyd" != none ]]; then
  "$verifyd" --helpfull >"$DEPLOY_TMP/help.txt" 2>&1 || true
  known=$(grep -oE -- '^ *--[a-z0-9_]+' "$DEPLOY_TMP/help.txt" | tr -d ' ' | sort -u)
  grep -qx -- '--layers' <<<"$known" || fail "verifyd --helpfull lists no --layers; cannot check flags"
  used=$(
    sed -n '/^ *args:/,/^ *envFrom:/p' "$ds" | grep -oE -- '- --[a-z0-9-]+' | awk '{print $2}'
    sed -n '/^ExecStart=/,/^$/p' "$systemd/verifyd@.service" | grep -oE -- '--[a-z0-9-]+'
    grep -E '^VERIFYD_FLAGS=' "$systemd/verifyd.env.example" | grep -oE -- '--[a-z0-9-]+'
    grep -oE -- '^\| `--[a-z0-9-]+`' "$root/deploy/README.md" | grep -oE -- '--[a-z0-9-]+'
  )
  count=0
  for flag in $(sort -u <<<"$used"); do
    grep -qx -- "$(tr - _ <<<"${flag#--}" | sed 's/^/--/')" <<<"$known" ||
      fail "the bundle uses $flag but verifyd --helpfull does not list it"
    count=$((count + 1))
  done
  echo "flags: all $count flags used by the bundle and the README exist in verifyd"
else
  not_run+=("flag names against verifyd --helpfull (verifyd not built)")
fi

for n in "${not_run[@]}"; do echo "COULD NOT RUN: $n"; done
echo "PASS"
