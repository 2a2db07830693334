#!/usr/bin/env bash
# make chart-scan (part of make lint): checkov's Kubernetes checks, offline, on the chart rendered
# with its default values and with every optional object on (open-values.yaml). Every failed check
# fails the scan; a check the chart cannot meet is skipped in its template with the reason beside it
# (checkov.io/skipN annotations; docs/security/supply-chain.md, "The chart scan").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${CHART_SCAN_VENV:-$repo/.venv-scan}
stamp="$venv/.installed-$(cksum < "$here/requirements.txt" | cut -d' ' -f1)"
if [ ! -e "$stamp" ]; then
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
bin=$(bash "$repo/hack/build.sh" | tail -n1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin/helm" template durable-agents "$repo/charts/durable-agents" -n durable-agents > "$out/defaults.yaml"
"$bin/helm" template durable-agents "$repo/charts/durable-agents" -n durable-agents \
  -f "$here/open-values.yaml" > "$out/open.yaml"
export CKV_SKIP_PACKAGE_UPDATE_CHECK=true BC_SKIP_MAPPING=TRUE
status=0
for rendering in defaults open; do
  echo "chart scan ($rendering values):"
  "$venv/bin/checkov" -f "$out/$rendering.yaml" --framework kubernetes --skip-download --quiet --compact \
    || status=1
done
exit $status
