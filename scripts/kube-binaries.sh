#!/usr/bin/env bash
# Builds the real control plane the Kubernetes tests run against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kueue, kwok) from the wrapper modules in
# devtools/kube/, once per version, into a cache outside the repository; a second run
# reuses them. Prints the bin directory on its last line.
#
#   bin=$(bash scripts/kube-binaries.sh | tail -n1)
#   bash scripts/kube-binaries.sh --check   # only locate a complete build; exit 1 if none
#
# Beside bin/ it copies what devtools/kube_cluster.py reads from the module sources: Kueue's
# CRDs and webhook manifests (kueue/) and KWOK's stages (kwok/stage/).
# The cache key is the pinned versions plus a hash of the wrapper modules' go.mod/go.sum
# and the Go version, so changing a pin builds a fresh directory.
# Override the cache root with IRIS_KUBE_CACHE (default ~/.cache/iris-kube).
#
# Measured on the 2-core project machine (shared with other tests, load 4-9; under nice),
# Go 1.26.8, empty Go build and module caches, modules through the module proxy. Built in this
# order; each time includes its downloads and the compiles earlier binaries had not cached:
#   etcd 3.6.16                     140 s
#   kube-apiserver 1.35.4           345 s
#   kube-controller-manager 1.35.4  181 s
#   kube-scheduler 1.35.4            15 s
#   kueue 0.17.0                    647 s
#   kwok 0.8.0                      ~250 s (327 s alone with empty caches)
#   total cold                      ~26.5 min (36 min wall: the build was held stopped ~10 min)
#   warm (all cached)               0.03 s; --check the same
# Peak memory 2.0 GB (linking); it leaves 5.1 GB in GOCACHE, 1.5 GB in GOMODCACHE and
# 470 MB of binaries.
# Reproduce a cold run without touching your own caches:
#   t=$(mktemp -d); GOCACHE=$t/gocache GOMODCACHE=$t/gomod IRIS_KUBE_CACHE=$t/kube \
#     bash scripts/kube-binaries.sh
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
src=$repo/devtools/kube
# Go builds are long and CPU-bound; never starve the tests others run on this machine.
nice=(nice -n 19)
if command -v ionice >/dev/null; then nice+=(ionice -c3); fi

# The version a wrapper module pins for one of its dependencies.
pin() { awk -v m="$2" '$1 == m || ($1 == "require" && $2 == m) { print ($1 == "require" ? $3 : $2); exit }' "$src/$1/go.mod"; }
k8s=$(pin kubernetes k8s.io/kubernetes)
etcd=$(pin etcd go.etcd.io/etcd/server/v3)
kueue=$(pin kueue sigs.k8s.io/kueue)
kwok=$(pin kwok sigs.k8s.io/kwok)
hash=$( { go version; cat "$src"/*/go.mod "$src"/*/go.sum; } | sha256sum | cut -c1-12)
dir=${IRIS_KUBE_CACHE:-$HOME/.cache/iris-kube}/k8s-$k8s-etcd-$etcd-kueue-$kueue-kwok-$kwok-$hash
bin=$dir/bin
names=(etcd kube-apiserver kube-controller-manager kube-scheduler kueue kwok)

if [[ ${1:-} == --check ]]; then
  for name in "${names[@]}"; do [[ -x $bin/$name ]] || exit 1; done
  [[ -d $dir/kueue && -d $dir/kwok ]] || exit 1
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
# One build at a time per cache directory (CI and a developer may race on the same one).
exec 9>"$dir/.lock"
flock 9

# Kubernetes reads its own version from these (Kueue and KWOK check the server's version).
IFS=. read -r major minor _ <<<"${k8s#v}"
v=k8s.io/component-base/version
k8s_ldflags="-X $v.gitVersion=$k8s -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean"

build() { # module dir, binary name, package, extra ldflags
  local mod=$1 name=$2 pkg=$3 ldflags="-s -w ${4:-}"
  [[ -x $bin/$name ]] && return
  local start=$SECONDS
  # Build beside the target, then rename: a killed build never leaves a half binary.
  (cd "$src/$mod" && "${nice[@]}" go build -trimpath -ldflags="$ldflags" -o "$bin/.$name.tmp" "$pkg")
  mv "$bin/.$name.tmp" "$bin/$name"
  echo "built $name in $((SECONDS - start)) s" >&2
}

build etcd etcd go.etcd.io/etcd/server/v3
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok

share() { # module dir, module path, destination under $dir, folders of the module to copy
  local mod=$1 path=$2 dest=$dir/$3 from folder
  shift 3
  [[ -d $dest ]] && return
  from=$(cd "$src/$mod" && go list -m -f '{{.Dir}}' "$path")
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  for folder in "$@"; do cp -r "$from/$folder" "$dest.tmp/"; done
  chmod -R u+w "$dest.tmp"  # the module cache is read-only
  mv "$dest.tmp" "$dest"
}
share kueue sigs.k8s.io/kueue kueue config/components/crd config/components/webhook
share kwok sigs.k8s.io/kwok kwok kustomize/stage

echo "$bin"
