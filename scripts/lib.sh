# shellcheck shell=bash
# Shared by bench.sh and test.sh: install what is missing, configure and build. Sourced, not run.
# Every step says what it does; running it again does only what is still needed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Debian 12 packages (docs/design/rules.md, "Optional parts switch on when found"). bench.sh installs
# what the library and comm-bench need; test.sh adds what the tests need (Catch2, the Python and
# PyTorch tests, the plots). docs/building.md lists both.
BENCH_PACKAGES=(meson ninja-build pkg-config g++ libhwloc-dev libucx-dev libibverbs-dev nlohmann-json3-dev libssl-dev
                libipsec-mb-dev libipsec-mb1 prometheus-cpp-dev)
# shellcheck disable=SC2034 # read by test.sh, which sources this file
TEST_PACKAGES=("${BENCH_PACKAGES[@]}" catch2 python3-numpy python3-torch python3-matplotlib
               libtorch-dev pybind11-dev python3-dev python3-venv python3-setuptools python3-wheel prometheus
               iproute2 iptables)

# Build directories (override to keep several builds side by side).
BUILD_DIR=${BUILD_DIR:-build}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}

step() { printf '\n==> %s\n' "$*"; }
die() { printf '\nerror: %s\n' "$*" >&2; exit 1; }

installed() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'; }

# Set when install_missing installed something: an existing build directory is then configured
# again, so that parts whose packages just arrived (tests, the torch extension) switch on.
INSTALLED_NOW=0

# install_missing PACKAGE...: apt-get install the ones dpkg does not have.
install_missing() {
  step "checking packages: $*"
  local missing=() p
  for p in "$@"; do
    installed "$p" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "all present"
    return
  fi
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "missing packages (${missing[*]}); run as root to install them"
    sudo=(sudo)
  fi
  step "installing: ${missing[*]} (apt-get update, then apt-get install)"
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  INSTALLED_NOW=1
}

# build_in DIR [MESON OPTIONS...]: configure DIR once (options applied again on later runs), then build.
build_in() {
  local dir=$1
  shift
  if [[ -f "$dir/meson-private/coredata.dat" ]]; then
    if ((INSTALLED_NOW)); then
      step "configuring $dir again (packages were installed): meson setup --reconfigure $dir $*"
      meson setup --reconfigure "$dir" "$@"
    elif (($# > 0)); then
      step "configuring $dir: $*"
      meson configure "$dir" "$@"
    fi
  else
    step "configuring $dir: meson setup $dir $*"
    meson setup "$dir" "$@"
  fi
  step "building $dir: ninja -C $dir${NINJA_JOBS:+ -j $NINJA_JOBS}"
  ninja -C "$dir" ${NINJA_JOBS:+-j "$NINJA_JOBS"}
}
