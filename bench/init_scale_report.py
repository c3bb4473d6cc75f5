"""One row of the init-at-scale table from the ranks' INIT_SCALE lines (bench/init_scale.c).

Shared by bench/init_scale.sh (ranks started by comm-run) and bench/init_burst.sh (ranks started
at once by a shell loop, as Slurm or mpirun start them).
Usage: init_scale_report.py OUTPUT RANKS LIMIT WALL_S RC CSV LABEL   (CSV "": no CSV line)
"""
import sys
path, n, limit, wall, rc = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
csv, label = sys.argv[6], sys.argv[7]
rows = []
for line in open(path, errors="replace"):
    if "INIT_SCALE " in line:
        rows.append({k: float(v) for k, v in (kv.split("=") for kv in line.split("INIT_SCALE ", 1)[1].split())})
if len(rows) < n or rc != 0:
    lines = [l.strip() for l in open(path, errors="replace") if "INIT_SCALE" not in l]
    errs = ([l for l in lines if "init_scale:" in l] or lines)[:2] + lines[-1:]  # the first rank errors, the verdict
    print(f"{n:6d} {limit:>6} {wall:7.1f}  FAILED (rc {rc}, {len(rows)} of {n} ranks reported): " + " | ".join(errs))
    sys.exit(0)
mx = lambda k: max(r[k] for r in rows)
mean = lambda k: sum(r[k] for r in rows) / len(rows)
r0 = next(r for r in rows if r["rank"] == 0)
rest = [r for r in rows if r["rank"] != 0] or rows
fds_rest = int(max(r["fds_init"] for r in rest))  # rank 0 also holds the store's connections
print(f"{n:6d} {limit:>6} {wall:7.1f} {mx('init_s'):8.2f} {mx('barrier_s'):8.3f} {mx('first8_s')*1e3:9.2f} "
      f"{mean('later8_s')*1e3:9.3f} {mx('big_s'):8.2f} {int(r0['fds_init']):8d}/{fds_rest:<8d} "
      f"{int(mx('fds_end')):7d} {mx('rss_kb')/1024:7.1f} {int(r0['store_init']):8d}/{int(r0['store_end']):<6d} "
      f"{int(mx('fds_pre')) if 'fds_pre' in r0 else '-':>7}")
if csv:
    with open(csv, "a") as f:
        f.write(f"{label},{n},{limit},{mx('init_s'):.4f},{int(mx('fds_init'))},{int(mx('fds_pre')) if 'fds_pre' in r0 else ''}\n")
