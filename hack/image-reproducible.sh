#!/usr/bin/env bash
# make image-reproducible: builds the image of this checkout twice with hack/image.sh, the second
# time with nothing reused (IMAGE_NO_CACHE=1: the dependencies' wheels made again, docker build
# --no-cache), and compares the two image IDs (the digest of the config, which names every layer by
# its content) and the two SBOMs. When they differ, both images are saved and hack/image_supply.py
# lists what differs (config fields; per layer, each file's mode, time or content); exit 1.
# The Debian base is an input, not rebuilt: the same base tarball (cached by hack/image.sh) is
# imported once; a base made again by debootstrap differs (package downloads, dpkg's logs' times).
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
docker() { $sudo /usr/bin/docker "$@"; }
py=$repo/.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() {  # $1: a name for the log; the rest: environment for hack/image.sh. Prints the image ID.
  local name=$1; shift
  env "$@" bash hack/image.sh 2>&1 | tee "$work/$name.log" >&2
  cp build/sbom.cdx.json "$work/$name.sbom.json"
  sed -n 's/^image ID: \(sha256:[0-9a-f]*\) .*/\1/p' "$work/$name.log"
}

[ -z "$(git status --porcelain)" ] || echo "note: the checkout has changes that are not committed" >&2
first=$(build first)
# The first image stays under a name of its own while the second is built (its tags move).
keep=localhost/durable-agents:reproducible-first
docker tag "$first" "$keep"
second=$(build second IMAGE_NO_CACHE=1)
echo "first build:                 $first"
echo "second build (no cache):     $second"
sbom_first=$(sha256sum <"$work/first.sbom.json" | cut -d' ' -f1)
sbom_second=$(sha256sum <"$work/second.sbom.json" | cut -d' ' -f1)
echo "SBOMs (sha256):              $sbom_first, $sbom_second"
if [ "$first" = "$second" ] && [ "$sbom_first" = "$sbom_second" ]; then
  docker rmi "$keep" >/dev/null
  echo "reproducible: the same image ID and the same SBOM, twice ($(git rev-parse --short HEAD))"
  exit 0
fi
echo "NOT reproducible: what differs (docker save of both, compared):"
docker save -o "$work/first.tar" "$keep"
docker save -o "$work/second.tar" "$second"
"$py" hack/image_supply.py compare "$work/first.tar" "$work/second.tar" || :
docker rmi "$keep" >/dev/null
exit 1
