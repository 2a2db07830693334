#!/usr/bin/env bash
# Builds the operator image, localhost/durable-agents:<version> (and :dev), with no registry:
#   1. installs Docker (Debian's docker.io) and debootstrap when missing, and starts a dockerd
#      (vfs storage, no bridge or iptables rules: nothing here needs a container network) when no
#      daemon answers; it keeps running afterwards, its log in the cache;
#   2. builds the wheels on the host into build/wheels: the project's, from a clean copy of its
#      sources (never the test kit), and its dependencies' at the versions of the tested .venv;
#   3. unless BASE_IMAGE is given, makes a Debian bookworm base with debootstrap (python3,
#      ca-certificates), cached as a tarball and imported as localhost/durable-agents-base:bookworm;
#   4. docker build --network none: pip install --require-hashes of the wheels (their sha256 in
#      build/wheels/requirements.txt), the SBOM of the installed environment (CycloneDX, made by
#      cyclonedx-py from its own wheels in build/sbom-tool, never installed in the image) at
#      /opt/durable-agents/sbom.cdx.json and copied to build/sbom.cdx.json, the OCI labels (source,
#      version, revision, created); the image's times set to the commit's (SOURCE_DATE_EPOCH), so
#      two builds of one commit give one image ID (make image-reproducible proves it);
#   5. checks the image: size, user, read-only root filesystem, no pip/pytest/test kit/compiler;
#   6. with IMAGE_SAVE=<path>, docker save's the image there (for `ctr images import`).
# With IMAGE_VERSION=<v>, the wheel and the image are built as version <v> (the sources' version
# rewritten in the clean copy) and tagged :<v> only, not :dev: a rebuilt image with a changed
# version, as an upgrade brings (the node suite's `helm upgrade` test).
# IMAGE_NO_CACHE=1 builds without the build cache (make image-reproducible). IMAGE_SOURCE sets the
# source label (default: the `origin` remote's URL, credentials removed, else "unknown").
# Environment: BASE_IMAGE, IMAGE_SAVE, IMAGE_VERSION, IMAGE_NO_CACHE, IMAGE_SOURCE, DEBIAN_MIRROR,
# DURABLE_AGENTS_CACHE, DOCKERD_ARGS.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cache=${DURABLE_AGENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/durable-agents}
mkdir -p "$cache"
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
py=$repo/.venv/bin/python
start=$SECONDS
step() { echo "==> [$((SECONDS - start))s] $*" >&2; }

# --- 1. Docker and debootstrap -------------------------------------------------------------------
missing=()
[ -x /usr/bin/docker ] && command -v dockerd >/dev/null || missing+=(docker.io)
[ -n "${BASE_IMAGE:-}" ] || command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]} (apt)"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's client, matching its daemon (another `docker` earlier on PATH may be a newer client).
docker() { $sudo /usr/bin/docker "$@"; }

if ! docker info >/dev/null 2>&1; then
  log=$cache/dockerd.log
  step "starting dockerd (vfs storage; log: $log)"
  # setsid: the daemon outlives this script and an interrupted make.
  # shellcheck disable=SC2086
  $sudo setsid dockerd --storage-driver=vfs --bridge=none --iptables=false \
    ${DOCKERD_ARGS:-} >>"$log" 2>&1 </dev/null &
  dockerd_pid=$!
  for _ in $(seq 1 240); do   # up to 60 s
    docker info >/dev/null 2>&1 && break
    $sudo kill -0 "$dockerd_pid" 2>/dev/null || { tail -n 20 "$log" >&2; echo "dockerd exited" >&2; exit 1; }
    sleep 0.25
  done
  docker info >/dev/null 2>&1 || { tail -n 20 "$log" >&2; echo "dockerd did not answer in 60 s" >&2; exit 1; }
  echo "dockerd started (pid $dockerd_pid); stop it with: kill $dockerd_pid" >&2
fi

# --- 2. Wheels -----------------------------------------------------------------------------------
wheels=$repo/build/wheels
version=$("$py" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=localhost/durable-agents
names=("$image:$version" "$image:dev")
if [ -n "${IMAGE_VERSION:-}" ]; then
  [[ $IMAGE_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.dev[0-9]+)?$ ]] ||
    { echo "IMAGE_VERSION=$IMAGE_VERSION: expected X.Y.Z or X.Y.Z.devN (a version and an image tag)" >&2; exit 2; }
  version=$IMAGE_VERSION
  names=("$image:$version")
fi
reqs=$cache/image-requirements.txt
cons=$cache/image-constraints.txt
"$py" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' >"$reqs"
# The versions the tests ran against (there is no lock file): constraints, which add nothing.
"$py" -m pip freeze --exclude-editable >"$cons"
pip_version=$("$py" -m pip --version | cut -d' ' -f2)
key=$(cat "$reqs" "$cons" <(echo "pip==$pip_version") | cksum | cut -d' ' -f1)
# The SBOM's tool, at the version the dev extra pins (make venv installs it): only the image's
# install stage runs it, from a virtualenv of its own that the final image does not get.
sbom_tool=$repo/build/sbom-tool
sbom_pin=$(grep -i '^cyclonedx-bom==' "$cons") ||
  { echo "cyclonedx-bom is not in .venv (pyproject.toml's dev extra pins it): make venv" >&2; exit 1; }
[ -z "${IMAGE_NO_CACHE:-}" ] || rm -f "$wheels"/.deps-*   # made again, from pip's cache
if [ ! -f "$wheels/.deps-$key" ]; then
  step "building the dependencies' wheels into build/wheels (and the SBOM tool's into build/sbom-tool)"
  rm -rf "$wheels" "$sbom_tool" && mkdir -p "$wheels" "$sbom_tool"
  "$py" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$wheels" -r "$reqs" -c "$cons"
  # The pip that installs them in the image (run from its wheel, never installed there).
  "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$wheels" "pip==$pip_version"
  "$py" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$sbom_tool" "$sbom_pin" -c "$cons"
  touch "$wheels/.deps-$key"
fi
step "building the durable-agents wheel (from a clean copy of its sources)"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
# Only what the wheel is built from (tracked or new, never ignored files such as build/ or
# __pycache__), copied aside: the checkout's build/ is left to the tests that use it.
git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md 'LICEN[CS]E*' \
    'NOTICE*' MANIFEST.in setup.cfg setup.py operator controllers |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -C "$src" -xf -
if [ -n "${IMAGE_VERSION:-}" ]; then
  sed -i "s/^version = \".*\"$/version = \"$version\"/" "$src/pyproject.toml"
  sed -i "s/^__version__ = \".*\"$/__version__ = \"$version\"/" "$src/operator/durable_agents/__init__.py"
  grep -q "^__version__ = \"$version\"$" "$src/operator/durable_agents/__init__.py" ||
    { echo "could not set the version in the copy of the sources" >&2; exit 1; }
fi
rm -f "$wheels"/durable_agents-*.whl
# One timestamp for every file in the wheel and the image, the commit's: the same sources give the
# same wheel and the same image, and the build's cache holds.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 315532800)
SOURCE_DATE_EPOCH=$epoch \
  "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  --wheel-dir "$wheels" "$src"
# The image leaves out kubernetes.aio (see the Dockerfile): nothing shipped may use it.
if grep -rnE --include='*.py' 'kubernetes\.aio|from kubernetes import .*\baio\b' operator controllers; then
  echo "the operator uses kubernetes.aio, which the Dockerfile removes from the image" >&2; exit 1
fi
"$py" - "$wheels"/durable_agents-"$version"-*.whl <<'EOF'
import sys, zipfile
tops = {n.split("/")[0] for n in zipfile.ZipFile(sys.argv[1]).namelist()}
extra = {t for t in tops if not t.endswith(".dist-info")} - {"durable_agents", "durable_agents_controllers"}
sys.exit(f"the wheel ships {sorted(extra)}" if extra else 0)
EOF
# Every wheel the image installs, by its sha256 (pip install --require-hashes in the Dockerfile);
# the SBOM's root component is described by the project's pyproject.toml (its version as built).
"$py" hack/image_supply.py requirements "$wheels"
"$py" hack/image_supply.py requirements "$sbom_tool"
cp "$src/pyproject.toml" "$sbom_tool/pyproject.toml"

# The labels: where the sources are, which commit (with -dirty when the files the image is built
# from differ from it), when (the commit's time, as every file in the image).
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain -- pyproject.toml README.md operator \
    controllers Dockerfile .dockerignore hack/image.sh hack/image_supply.py)" ]; then
  revision=$revision-dirty
fi
source_url=${IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null | sed -E 's#^([a-z+]+://)[^/@]*@#\1#' || :)}
source_url=${source_url:-unknown}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# --- 3. The base ---------------------------------------------------------------------------------
base=${BASE_IMAGE:-}
if [ -z "$base" ]; then
  base=localhost/durable-agents-base:bookworm
  include=python3,ca-certificates
  mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  recipe=1   # bump when the recipe below changes: the cached tarball and the image are remade
  base_key=$(echo "bookworm minbase $include $recipe" | cksum | cut -d' ' -f1)
  tarball=$cache/base-bookworm-$base_key.tar
  if [ ! -f "$tarball" ]; then
    step "making the Debian bookworm base with debootstrap ($include)"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    # A failed debootstrap may leave /proc or bound device nodes mounted in it: unmount them, and
    # never cross into another file system when removing it.
    remove_rootfs() {
      awk -v r="$rootfs/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | xargs -r $sudo umount -l
      $sudo rm -rf --one-file-system "$rootfs"
    }
    trap 'rm -rf "$src"; remove_rootfs' EXIT
    $sudo debootstrap --variant=minbase --include="$include" bookworm "$rootfs" "$mirror" \
      >"$cache/debootstrap.log" 2>&1 || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
    # Trim: package lists and caches, documentation (copyright files stay), logs, host files.
    $sudo sh -c "cd '$rootfs' && rm -rf var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old \
      var/lib/dpkg/*-old var/log/* usr/share/man/* usr/share/info/* usr/share/lintian \
      usr/share/locale/* tmp/* root/.bash_history \
      && find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete \
      && find usr/share/doc -mindepth 1 -type d -empty -delete \
      && : > etc/machine-id && rm -f etc/resolv.conf etc/hostname"
    $sudo chmod 0755 "$rootfs"   # mktemp made it 0700: it becomes the image's /
    $sudo tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    remove_rootfs
  fi
  if [ "$(docker image inspect -f '{{index .Config.Labels "durable-agents.base-key"}}' "$base" 2>/dev/null)" != "$base_key" ]; then
    step "importing $tarball as $base"
    docker import --change "LABEL durable-agents.base-key=$base_key" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$base" >/dev/null
  fi
fi

# --- 4. Build and check --------------------------------------------------------------------------
step "docker build --network none (base: $base)${IMAGE_NO_CACHE:+, no cache}"
# BuildKit (built into this dockerd): the classic builder makes a container per instruction, each
# a full copy of the file system with the vfs driver (6 times slower here).
# The build's own image, under a name of this build (another build's prune spares it) until
# restamped below.
built=$image:build-$$
base_digest=$(docker image inspect -f '{{range .RepoDigests}}{{.}} {{end}}' "$base" | cut -d' ' -f1 | cut -s -d@ -f2)
DOCKER_BUILDKIT=1 docker build --progress plain --network none ${IMAGE_NO_CACHE:+--no-cache} \
  --build-arg "BASE_IMAGE=$base" --build-arg "BASE_DIGEST=$base_digest" --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url" --build-arg "CREATED=$created" \
  --build-arg "SOURCE_DATE_EPOCH=$epoch" --tag "$built" . >"$cache/image-build.log" 2>&1 ||
  { tail -n 30 "$cache/image-build.log" >&2; echo "docker build failed (log: $cache/image-build.log)" >&2; exit 1; }
# The engine's BuildKit stamps the config, and the files and directories its steps write, with
# the wall-clock time: the same image with the commit's time instead (what BuildKit 0.13+ does
# with SOURCE_DATE_EPOCH and rewrite-timestamp), loaded under the image's names; the SBOM copied
# out of its layers on the way.
id_file=$src/.restamped-id
docker save -o "$src/built.tar" "$built"
"$py" hack/image_supply.py restamp "$src/built.tar" "$epoch" "${names[@]}" --id-file "$id_file" \
  --base-layers "$(docker image inspect -f '{{len .RootFS.Layers}}' "$base")" \
  --base-history "$(docker history -q "$base" | wc -l)" \
  --extract "/opt/durable-agents/sbom.cdx.json=$repo/build/sbom.cdx.json" | docker load >/dev/null
rm -f "$src/built.tar"
docker rmi "$built" >/dev/null
id=$(cat "$id_file")
echo "image ID: $id (${names[*]}); SBOM: build/sbom.cdx.json" >&2
# vfs stores every layer as a full copy: drop this image's superseded builds, bound the cache.
for label in org.opencontainers.image.title=durable-agents durable-agents.base-key; do
  docker image prune --force --filter "label=$label" >/dev/null
done
docker builder prune --force --keep-storage 2GB >/dev/null

# The checks, as Kubernetes runs the image: read-only root, an emptyDir on /tmp, no capabilities.
# Each container costs a full copy of the image with vfs: two containers, and none when the image
# is unchanged since its checks were recorded.
run() { docker run --rm --network none --read-only --tmpfs /tmp --cap-drop ALL \
  --security-opt no-new-privileges "$@"; }
pycheck=$(cat <<'EOF'
import errno, importlib.util, os, sys, tempfile
from cryptography.hazmat.primitives.asymmetric import ec
try:
    open("/probe", "w")
    sys.exit("the root filesystem is writable")
except OSError as err:
    if err.errno != errno.EROFS:
        raise
    print("root filesystem: read-only (" + err.strerror + ")")
# What the webhook does with its serving certificate: a key made, written to a temporary directory.
ec.generate_private_key(ec.SECP256R1())
directory = tempfile.mkdtemp(prefix="durable-agents-webhook-")
with open(os.path.join(directory, "tls.key"), "wb") as out:
    out.write(b"-")
print("temporary files: writable under", directory)
absent = ("pip", "setuptools", "pytest", "hypothesis", "durable_agents_testkit", "mypy", "ruff", "cyclonedx")
present = [m for m in absent if importlib.util.find_spec(m)]
if present:
    sys.exit("importable in the image: " + ", ".join(present))
print("not importable:", ", ".join(absent))
EOF
)
shcheck=$(cat <<'EOF'
set -e
echo "id:    $(id)"
python -c "$PYCHECK"
found=$(for t in pip pip3 gcc cc make pytest; do command -v $t || :; done)
[ -z "$found" ] || { echo "in the image: $found"; exit 1; }
[ -z "$(find / -xdev -name '*testkit*' -print -quit 2>/dev/null)" ] || { echo "a test kit is in the image"; exit 1; }
echo "not on PATH: pip, pip3, gcc, cc, make, pytest; no *testkit* file anywhere"
EOF
)
# A container the engine could not create (seen once here, while a node test bed was torn down
# beside it) says nothing about the image: it is tried once more.
try_run() {
  local out rc attempt
  for attempt in 1 2; do
    set +e
    out=$(run "$@" 2>&1); rc=$?
    set -e
    case $out in
      *"OCI runtime create failed"*) [ "$attempt" = 2 ] || { echo "($out: once more)" >&2; continue; } ;;
    esac
    break
  done
  printf '%s\n' "$out"
  return "$rc"
}
check_image() {
  local size base_size out rc
  size=$(docker image inspect -f '{{.Size}}' "$id")
  base_size=$(docker image inspect -f '{{.Size}}' "$base")
  echo "image: ${names[*]}  $((size / 1048576)) MiB (base $((base_size / 1048576)) MiB)"
  echo "USER:  $(docker image inspect -f '{{.Config.User}}' "$id")"
  # The real entry point: a malformed setting stops it with exit code 2 (no cluster is needed
  # for that, and every controller module has been imported by then).
  out=$(try_run -e DURABLE_AGENTS_NO_SUCH_SETTING=1 "$id") && rc=0 || rc=$?
  echo "entry point: exit $rc: $out"
  [ "$rc" = 2 ] || { echo "expected exit code 2 from the entry point" >&2; return 1; }
  try_run -e PYCHECK="$pycheck" --entrypoint sh "$id" -c "$shcheck"
}

checked=$cache/image-checked-${id#sha256:}.txt
if [ -f "$checked" ]; then
  step "the image is unchanged (${id:7:12}): its checks, as recorded when it was built"
  cat "$checked"
else
  step "checking the image (read-only root, an emptyDir on /tmp, no capabilities)"
  check_image | tee "$checked.tmp"
  mv "$checked.tmp" "$checked"
fi

# --- 6. For the test bed -------------------------------------------------------------------------
if [ -n "${IMAGE_SAVE:-}" ]; then
  docker save -o "$IMAGE_SAVE" "${names[@]}"
  echo "saved: $(cd "$(dirname "$IMAGE_SAVE")" && pwd)/$(basename "$IMAGE_SAVE") (ctr -n k8s.io images import it)"
fi
step "done: $image:$version"
