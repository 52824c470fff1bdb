#!/usr/bin/env bash
# Builds fake-gcs-server, the Google Cloud Storage emulator the GCS bundle store's tests run
# against, from the wrapper module devtools/gcs/, once per version, into a cache outside the
# repository; a second run reuses it. Prints the binary's path on its last line.
#
#   server=$(bash scripts/gcs-emulator.sh | tail -n1)
#   bash scripts/gcs-emulator.sh --check   # only locate a build; exit 1 if none
#
# Kept apart from scripts/kube-binaries.sh so a change here never rebuilds the control plane.
# Override the cache root with IRIS_GCS_CACHE (default ~/.cache/iris-gcs).
# Measured on the 2-core project machine under nice, Go 1.26.8, module cache warm for the
# control plane only: 29 s of downloads and 70 s of compiling; 34 MB binary.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
src=$repo/devtools/gcs
nice=(nice -n 19)
if command -v ionice >/dev/null; then nice+=(ionice -c3); fi

version=$(awk '$1 == "github.com/fsouza/fake-gcs-server" { print $2; exit }' "$src/go.mod")
hash=$( { go version; cat "$src/go.mod" "$src/go.sum"; } | sha256sum | cut -c1-12)
dir=${IRIS_GCS_CACHE:-$HOME/.cache/iris-gcs}/fake-gcs-server-$version-$hash
server=$dir/fake-gcs-server

if [[ ${1:-} == --check ]]; then
  [[ -x $server ]] || exit 1
  echo "$server"
  exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ ! -x $server ]]; then
  start=$SECONDS
  # Build beside the target, then rename: a killed build never leaves a half binary.
  (cd "$src" && "${nice[@]}" go build -trimpath -ldflags="-s -w" -o "$server.tmp" github.com/fsouza/fake-gcs-server)
  mv "$server.tmp" "$server"
  echo "built fake-gcs-server in $((SECONDS - start)) s" >&2
fi
echo "$server"
