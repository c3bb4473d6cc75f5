#!/usr/bin/env python3
"""Reads nccl-tests logs (all_reduce_perf and friends) and comm-bench's, which share the format.

Modeled on how nccl-tests log parsers read them: every line starting with '#' is a comment
(header, column titles, footer), every other non-empty line is a row of 13 whitespace-separated
columns: size count type redop root, then time algbw busbw #wrong out of place and in place.
The footer gives "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth : X".
With -S 1 (report_timestamps) a row ends with the date and time it finished: 15 columns, read
into "timestamp".
"""
import re
import sys

COLUMNS = ("size", "count", "type", "redop", "root",
           "oop_time", "oop_algbw", "oop_busbw", "oop_wrong",
           "ip_time", "ip_algbw", "ip_busbw", "ip_wrong")

_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
# nccl-tests' parameter line: "# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5
# iters: 20 agg iters: 1 validation: 1 graph: 0"
_CONFIG = re.compile(r"^#\s*nThread (?P<nthread>\d+) nGpus (?P<ngpus>\d+) minBytes (?P<minbytes>\d+) "
                     r"maxBytes (?P<maxbytes>\d+) step: (?P<step>\d+)\(\w+\) warmup iters: (?P<warmup>\d+) "
                     r"iters: (?P<iters>\d+) agg iters: (?P<agg>\d+) validation: (?P<validation>\d+) "
                     r"graph: (?P<graph>\d+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")


class ParseError(ValueError):
    pass


def _wrong(text):
    return None if text == "N/A" else int(text)


def parse_row(line):
    fields = line.split()
    stamp = None
    if len(fields) == len(COLUMNS) + 2 and re.fullmatch(r"\d{4}-\d\d-\d\d", fields[-2]):
        stamp = fields[-2] + " " + fields[-1]
        fields = fields[:-2]
    if len(fields) != len(COLUMNS):
        raise ParseError(f"expected {len(COLUMNS)} columns, got {len(fields)}: {line!r}")
    try:
        return {
            "timestamp": stamp,
            "size": int(fields[0]), "count": int(fields[1]), "type": fields[2], "redop": fields[3],
            "root": int(fields[4]),
            "oop_time": float(fields[5]), "oop_algbw": float(fields[6]), "oop_busbw": float(fields[7]),
            "oop_wrong": _wrong(fields[8]),
            "ip_time": float(fields[9]), "ip_algbw": float(fields[10]), "ip_busbw": float(fields[11]),
            "ip_wrong": _wrong(fields[12]),
        }
    except ValueError as e:
        raise ParseError(f"bad value in {line!r}: {e}") from e


def parse(text, strict=True):
    """Returns {"rows": [...], "avg_busbw": float|None, "out_of_bounds": int|None, "ok": bool|None,
    "header": [comment lines], "config": {nthread, ngpus, ..., agg, validation, graph}|None}. strict: a non-comment line that is not a row raises ParseError;
    otherwise such lines (another rank's "[1] ..." output, say) are skipped."""
    out = {"rows": [], "avg_busbw": None, "out_of_bounds": None, "ok": None, "header": [], "config": None}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            if m := _CONFIG.match(line):
                out["config"] = {k: int(v) for k, v in m.groupdict().items()}
                out["header"].append(line)
            elif m := _AVG.match(line):
                out["avg_busbw"] = float(m.group(1))
            elif m := _OOB.match(line):
                out["out_of_bounds"], out["ok"] = int(m.group(1)), m.group(2) == "OK"
            else:
                out["header"].append(line)
            continue
        try:
            out["rows"].append(parse_row(line))
        except ParseError:
            if strict:
                raise
    return out


def header_value(parsed, key):
    """The value of a '# key: value' header line (e.g. 'transport', 'algorithm'), or None."""
    for line in parsed["header"]:
        m = re.match(r"^#\s*" + re.escape(key) + r":\s*(.*)$", line)
        if m:
            return m.group(1).strip()
    return None


if __name__ == "__main__":
    parsed = parse(open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read())
    for r in parsed["rows"]:
        print(r["size"], r["oop_busbw"], r["ip_busbw"], r["oop_wrong"], r["ip_wrong"])
    print("avg busbw", parsed["avg_busbw"], "out of bounds", parsed["out_of_bounds"])
