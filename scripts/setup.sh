#!/usr/bin/env bash
# Installs the Debian 12 packages switchml needs to build and test. Idempotent: installs only
# what is missing, and runs apt-get update only when something is. Takes no arguments.
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in
  "") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "setup: unexpected argument '$1': it takes none (see --help)" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config iproute2 nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libsodium-dev  # SipHash tags of the authenticated data plane (transport/auth.h)
  libxdp-dev libbpf-dev clang  # the AF_XDP transport and its XDP program (optional at configure time)
  python3-dev pybind11-dev python3-numpy python3-torch libtorch-dev python3-sklearn python3-matplotlib
  libopenblas0-openmp  # an optimized BLAS for torch and numpy (the default libblas3 is the reference one, ~7x slower)
  libdpdk-dev libsystemd-dev  # the DPDK transport; its static pkg-config libs name -lsystemd (install_test)
  openssl  # a throw-away CA for the control plane's TLS test (control_tls_test)
  prometheus-cpp-dev  # the switch's and worker's /metrics (src/metrics/)
  prometheus curl  # the real Prometheus server scraping a switch in metrics_prometheus_test
  help2man  # the man pages made from --help (packaging/, scripts/package.sh)
  clang-14 libfuzzer-14-dev libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} build packages are installed"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
