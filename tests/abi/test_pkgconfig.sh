#!/bin/sh
# The installed library as a C user meets it: `meson install --destdir` into a scratch
# directory, then a C11 program built with only `pkg-config comm`'s flags (the header must be
# valid C), run against the installed libcomm.so. Also: only comm_* symbols are exported and
# the SONAME carries the ABI major version.
# usage: test_pkgconfig.sh BUILD_DIR C11_SOURCE
set -eu

build=$1
source=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d /tmp/abi-pkgconfig-XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "# meson install --destdir $tmp"
meson install -C "$build" --destdir "$tmp" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "meson install failed"; }

pc=$(find "$tmp" -name comm.pc | head -n 1)
[ -n "$pc" ] || fail "no comm.pc installed"
echo "# found $pc"
pcdir=$(dirname "$pc")
prefix=$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=prefix comm)
pkgconf() { PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$tmp$prefix" "$@" comm; }
flags=$(pkgconf --cflags --libs)
libdir=$(pkgconf --variable=libdir)
includedir=$(pkgconf --variable=includedir)
echo "# pkg-config comm: $flags"
[ -f "$includedir/comm/comm.h" ] || fail "comm/comm.h is not installed under $includedir"

echo "# cc -std=c11 -Wall -Wextra -Werror -pedantic $source"
# shellcheck disable=SC2086 # flags are words
cc -std=c11 -Wall -Wextra -Werror -pedantic -Wstrict-prototypes "$source" -o "$tmp/c11_consumer" $flags ||
  fail "the C11 program does not build against the installed header"
echo "# c++ -std=c++17 -fsyntax-only on the header"
printf '#include <comm/comm.h>\nint main() { return COMM_OK; }\n' >"$tmp/cxx.cc"
c++ -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$includedir" "$tmp/cxx.cc" ||
  fail "the header is not valid C++17"

echo "# running it against $libdir"
LD_LIBRARY_PATH="$libdir" "$tmp/c11_consumer" || fail "the C11 program failed"
LD_LIBRARY_PATH="$libdir" ldd "$tmp/c11_consumer" | grep -q "$libdir/libcomm.so.1" ||
  fail "the C11 program did not load the installed libcomm.so.1"

so="$libdir/libcomm.so"
[ -e "$so" ] || fail "no $so (the development symlink)"

echo "# exported symbols"
exports=$(nm -D --defined-only "$so" | awk '{print $NF}' | sed 's/@.*//')
[ -n "$exports" ] || fail "nm found no exported symbols"
others=$(printf '%s\n' "$exports" | grep -v -e '^comm_' -e '^LIBCOMM_' || true)
[ -z "$others" ] || fail "exported symbols other than comm_*: $(echo $others)"
for f in comm_init comm_allreduce comm_iallreduce comm_group_start comm_last_error comm_split comm_get_version_string; do
  printf '%s\n' "$exports" | grep -qx "$f" || fail "$f is not exported"
done
echo "# $(printf '%s\n' "$exports" | grep -c '^comm_') comm_* symbols, nothing else"

soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "libcomm.so.1" ] || fail "SONAME is '$soname', expected libcomm.so.1"
echo "# SONAME $soname"

# UCX and libibverbs are opened with dlopen when wanted, so libcomm.so.1 loads on hosts without
# them (transports/ucx/ucx_library.cc, topology/probe_ibverbs.cc).
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
echo "# NEEDED: $needed"
for lib in libucp libucs libuct libucm libibverbs; do
  case " $needed" in *" $lib"*) fail "libcomm.so.1 links $lib: it must be opened with dlopen";; esac
done

# nccl-tests' names (all_reduce_perf, ...) would shadow a real nccl-tests on PATH: installed only
# with -Dperf_aliases=true (the build tree always has them).
bench=$(find "$tmp" -path '*/bin/comm-bench' | head -n 1)
[ -n "$bench" ] || fail "comm-bench is not installed"
if [ "${ABI_PERF_ALIASES:-false}" = true ]; then
  [ -e "$(dirname "$bench")/all_reduce_perf" ] || fail "-Dperf_aliases=true but all_reduce_perf is not installed"
else
  [ ! -e "$(dirname "$bench")/all_reduce_perf" ] || fail "all_reduce_perf installed into bindir without -Dperf_aliases=true"
fi
echo "# $("$bench" --version)"
find "$tmp" -path '*/doc/libcomm/LICENSE' | grep -q . || fail "LICENSE is not installed under share/doc/libcomm"
echo "ok"
