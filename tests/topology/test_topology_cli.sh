#!/usr/bin/env bash
# comm-topo from the command line: this machine (never fails; says what it did not find), every
# fixture in --json and --explain, a hwloc 3 file and a bad option as clear errors.
set -uo pipefail

COMM_TOPO=${1:?usage: test_topology_cli.sh PATH/TO/comm-topo}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FIXTURES=${COMM_FIXTURES_DIR:-$HERE/../fixtures}  # real machine exports (tests/fixtures/README.md)
fail=0
check() {  # description, command...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

env -u COMM_TOPO_XML -u NCCL_TOPO_FILE "$COMM_TOPO" >"$tmp/here.txt" 2>&1
check "comm-topo on this machine exits 0" test $? -eq 0
check "it shows the plan per peer class" grep -q "same host, same NUMA node" "$tmp/here.txt"
if ! ls /sys/class/infiniband/* >/dev/null 2>&1; then
  check "no RDMA device here: it says so" grep -q "RDMA devices: none found" "$tmp/here.txt"
fi
env -u COMM_TOPO_XML -u NCCL_TOPO_FILE "$COMM_TOPO" --json >"$tmp/here.json"
check "--json is JSON with the schema name" python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['schema']=='libcomm.topology/1'" "$tmp/here.json"

if [[ -r $FIXTURES/README.md ]]; then
  for f in "$FIXTURES"/hwloc/*.xml "$FIXTURES"/nccl-topo/*.xml; do
    name=$(basename "$f")
    "$COMM_TOPO" --topology "$f" --explain >"$tmp/out.txt" 2>&1
    check "$name: --explain exits 0 and explains" grep -q "^Decisions" "$tmp/out.txt"
    "$COMM_TOPO" --topology "$f" --json | python3 -c "import json,sys; d=json.load(sys.stdin); assert len(d['plan']['peers'])==4" 
    check "$name: --json parses" test $? -eq 0
  done
  "$COMM_TOPO" --topology "$FIXTURES/hwloc/nvidiaDGX2.xml" >"$tmp/dgx2.txt"
  check "DGX-2: the NVLink matrix is printed" grep -q "through NVSwitch; 12 NVSwitch" "$tmp/dgx2.txt"
  COMM_CROSS_ZONE=1 "$COMM_TOPO" --topology "$FIXTURES/hwloc/coral-lassen.xml" >"$tmp/lassen.txt"
  check "COMM_CROSS_ZONE=1: NCCL_IB_TIMEOUT=23 with the time it allows" grep -q "4.096 us x 2^23 x 7 = 240.5 s" "$tmp/lassen.txt"
else
  echo "FAIL: fixtures not found at $FIXTURES (set COMM_FIXTURES_DIR)"
  fail=1
fi

sed 's/<topology version="2.0">/<topology version="3.0">/' "$FIXTURES/hwloc/nvidiaDGX2.xml" >"$tmp/v3.xml" 2>/dev/null ||
  printf '<topology version="3.0"></topology>\n' >"$tmp/v3.xml"
"$COMM_TOPO" --topology "$tmp/v3.xml" >"$tmp/v3.out" 2>&1
check "hwloc 3 XML: exit 1" test $? -eq 1
check "hwloc 3 XML: the message says so" grep -q "is hwloc 3.0 XML" "$tmp/v3.out"
"$COMM_TOPO" --no-such-option >/dev/null 2>&1
check "unknown option: exit 2" test $? -eq 2
exit $fail
