#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl for the local control plane, and
# helm (tests/integration/test_chart.py) and kstatus (tests/unit/test_health_table.py), into a cache outside the checkout, keyed by version, and
# skips what is already there. WITH_NODE=1 also builds kubelet, kube-scheduler, kube-proxy and the
# probe (the optional node, testkit/durable_agents_testkit/localcluster/node.py).
# Prints the bin directory on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${DURABLE_AGENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/durable-agents}
bin="$cache/bin/k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod -trimpath"

minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${minor} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"

build() { # name dir pkg ldflags
  local name=$1 dir=$2 pkg=$3 flags=$4
  if [ -x "$bin/$name" ]; then return 0; fi
  echo "building $name (first time on this machine; cached in $bin)" >&2
  local start=$SECONDS
  (cd "$here/$dir" && go build -ldflags "$flags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"   # atomic: a killed build never leaves a half binary
  echo "built $name in $((SECONDS - start))s" >&2
}

build etcd etcd . "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}"
build kube-apiserver kube ./cmd/kube-apiserver "$ldflags"
if [ "${WITH_CONTROLLER_MANAGER:-1}" = 1 ]; then
  build kube-controller-manager kube ./cmd/kube-controller-manager "$ldflags"
fi
build kubectl kube ./cmd/kubectl "$ldflags"

# The optional node (make cluster-up NODE=1, make test-node): kubelet, kube-scheduler and
# kube-proxy from the same module, and the probe that is the whole of the node's test images.
if [ "${WITH_NODE:-0}" = 1 ]; then
  build kubelet kube ./cmd/kubelet "$ldflags"
  build kube-scheduler kube ./cmd/kube-scheduler "$ldflags"
  build kube-proxy kube ./cmd/kube-proxy "$ldflags"
  # The probe is ours, not a pinned release: rebuilt whenever its source changes.
  probe_sum=$(cat "$here/probe/go.mod" "$here/probe/main.go" | cksum | cut -d' ' -f1)
  if [ "$(cat "$bin/probe.cksum" 2>/dev/null)" != "$probe_sum" ]; then rm -f "$bin/probe"; fi
  build probe probe . "-s -w"
  echo "$probe_sum" > "$bin/probe.cksum"
fi

# kstatus (tests/unit/test_health_table.py): ours over a pinned cli-utils, rebuilt whenever its
# source or go.mod (KSTATUS_VERSION) changes.
kstatus_sum=$(cat "$here/kstatus/go.mod" "$here/kstatus/main.go" | cksum | cut -d' ' -f1)
if [ "$(cat "$bin/kstatus.cksum" 2>/dev/null)" != "$kstatus_sum" ]; then rm -f "$bin/kstatus"; fi
build kstatus kstatus . "-s -w"
echo "$kstatus_sum" > "$bin/kstatus.cksum"

# helm shares the directory (its name does not carry HELM_VERSION): one built for another version
# is replaced. Its version variables are set as helm's own Makefile sets them, the Kubernetes
# version it assumes without a cluster (helm template, lint) from the client-go it is built with.
if [ -x "$bin/helm" ] && [ "$("$bin/helm" version --template '{{.Version}}' 2>/dev/null)" != "$HELM_VERSION" ]; then
  rm -f "$bin/helm"
fi
if [ ! -x "$bin/helm" ]; then
  client_go=$(cd "$here/helm" && go list -m -f '{{.Version}}' k8s.io/client-go)  # v0.X.Y: Kubernetes 1.X
  k8s_minor=${client_go#v0.}; k8s_minor=${k8s_minor%%.*}
  build helm helm helm.sh/helm/v3/cmd/helm "-s -w \
 -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} \
 -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${k8s_minor} \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${k8s_minor}"
fi
echo "$bin"
