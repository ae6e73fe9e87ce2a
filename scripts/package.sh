#!/usr/bin/env bash
# Builds the Debian package switchml_<version>_amd64.deb (docs/operations.md): configures
# build-pkg/ (or $BUILD_DIR) for /usr with the shared worker library, the Python module for
# Debian's python3 and the service files (cmake/SwitchmlPackage.cmake), builds it without the
# tests, runs CPack, then checks the package: its control fields (name, version, architecture,
# the dependencies it must name), its maintainer scripts and conffile, and that every file an
# installation needs is in it. Prints the package's path. Extra CMake options in $CMAKE_ARGS.
#   scripts/package.sh [--check-only DEB]   (--check-only: only check an existing package)
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
check_only=""
case "${1:-}" in
  "") ;;
  -h | --help) usage; exit 0 ;;
  --check-only) check_only="${2:?--check-only needs the .deb}" ;;
  *) echo "package.sh: unexpected argument '$1' (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

check() {
  local deb=$1 tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  dpkg-deb --field "$deb" >"$tmp/control"
  dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/files"
  dpkg-deb --ctrl-tarfile "$deb" | tar -t | sed 's|^\./||' >"$tmp/ctrl"
  local bad=0
  field() { sed -n "s/^$1: //p" "$tmp/control"; }
  [ "$(field Package)" = switchml ] || { echo "package.sh: Package is not switchml" >&2; bad=1; }
  [ "$(field Architecture)" = amd64 ] || { echo "package.sh: Architecture is not amd64" >&2; bad=1; }
  local version
  version=$(sed -n 's/^project(switchml VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  [ "$(field Version)" = "$version" ] || { echo "package.sh: Version is not $version" >&2; bad=1; }
  # Libraries the binaries link (found by dpkg-shlibdeps) and what the Python module and the
  # maintainer scripts need.
  for dep in libgrpc++1.51 libprotobuf32 libsodium23 libprometheus-cpp-pull1.0 libc6 \
    libstdc++6 python3 python3-numpy python3-torch adduser; do
    field Depends | tr ',' '\n' | sed 's/^ *//; s/ .*//' | grep -qx "$dep" ||
      { echo "package.sh: Depends does not name $dep: $(field Depends)" >&2; bad=1; }
  done
  for f in postinst prerm postrm conffiles; do
    grep -qx "$f" "$tmp/ctrl" || { echo "package.sh: no $f in the control archive" >&2; bad=1; }
  done
  for f in /usr/bin/switchml /usr/lib/systemd/system/switchml-switch.service \
    /lib/systemd/system/switchml-switch.service /etc/default/switchml-switch \
    /usr/include/switchml/context.h /usr/lib/x86_64-linux-gnu/cmake/switchml/switchmlConfig.cmake \
    /usr/lib/x86_64-linux-gnu/pkgconfig/switchml.pc /usr/lib/python3/dist-packages/switchml/__init__.py \
    /usr/lib/python3/dist-packages/switchml/torch.py /usr/share/doc/switchml/operations.md \
    /usr/share/man/man1/switchml.1.gz /usr/share/man/man1/switchml-switch.1.gz \
    /usr/share/man/man1/switchml-status.1.gz \
    /usr/share/doc/switchml/examples/switchml-switch.service.d/xdp.conf; do
    case "$f" in
      */systemd/system/*) grep -q "systemd/system/switchml-switch.service$" "$tmp/files" ;;
      *) grep -qx "$f" "$tmp/files" ;;
    esac || { echo "package.sh: $f is not in the package" >&2; bad=1; }
  done
  grep -q '^/usr/lib/x86_64-linux-gnu/libswitchml\.so' "$tmp/files" ||
    { echo "package.sh: no libswitchml.so in the package" >&2; bad=1; }
  grep -q '^/usr/lib/python3/dist-packages/switchml/_core.*\.so$' "$tmp/files" ||
    { echo "package.sh: no Python extension in the package" >&2; bad=1; }
  grep -q '^/usr/lib/python3/dist-packages/switchml/_torch.*\.so$' "$tmp/files" ||
    { echo "package.sh: no torch.distributed backend in the package" >&2; bad=1; }
  if [ "$bad" -ne 0 ]; then
    echo "package.sh: $deb is not right (control fields above)" >&2
    cat "$tmp/control" >&2
    return 1
  fi
  echo "package.sh: $deb: control fields, maintainer scripts and contents checked"
}

if [ -n "$check_only" ]; then
  check "$check_only"
  exit
fi

bash scripts/setup.sh
build_dir="${BUILD_DIR:-build-pkg}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_INSTALL_PREFIX=/usr -DSWITCHML_PACKAGE=ON -DSWITCHML_BUILD_SHARED=ON \
  -DSWITCHML_BUILD_TESTS=OFF -DSWITCHML_PYTHON_INSTALL_DIR=lib/python3/dist-packages \
  ${CMAKE_ARGS:-} >/dev/null
ninja -C "$build_dir"
(cd "$build_dir" && cpack -G DEB >cpack.log) || { cat "$build_dir/cpack.log" >&2; exit 1; }
deb=$(ls -t "$build_dir"/switchml_*_amd64.deb | head -1)
check "$deb"
echo "$deb"
