"""What one durable append costs this disk, three ways (issue 29's journal):

    python3 benches/fsync_probe.py /path/to/an/empty/folder/on/the/disk

500 writes of 4 KiB each: (1) into a preallocated, zero-filled file, then fdatasync
(the journal's way: the blocks exist, so only data is synced); (2) into a file whose
space is only fallocated (unwritten extents: the sync writes metadata too); (3) a new
file per write, fsynced, renamed and its folder fsynced (what a write-ahead log that
writes a file per flush costs). Prints p50 and p99 of each.
"""
import os, time, statistics, sys
d = sys.argv[1]
n = 500
def pct(xs, q): xs = sorted(xs); return xs[int(q*len(xs))]
# (a) a preallocated journal: append 4 KiB + fdatasync
p = os.path.join(d, "journal"); fd = os.open(p, os.O_RDWR|os.O_CREAT|os.O_TRUNC, 0o644)
os.posix_fallocate(fd, 0, 64<<20); os.fsync(fd)
# write zeros first so extents are written (not unwritten): fdatasync then needs no metadata
os.pwrite(fd, bytes(64<<20), 0); os.fsync(fd)
buf = b"x"*4096; lat=[]
for i in range(n):
    t=time.perf_counter(); os.pwrite(fd, buf, i*4096); os.fdatasync(fd); lat.append(time.perf_counter()-t)
print("preallocated+zeroed append+fdatasync p50 %.0f us p99 %.0f us" % (pct(lat,.5)*1e6, pct(lat,.99)*1e6))
os.close(fd)
fd = os.open(p+"2", os.O_RDWR|os.O_CREAT|os.O_TRUNC, 0o644); os.posix_fallocate(fd, 0, 64<<20); os.fsync(fd); lat=[]
for i in range(n):
    t=time.perf_counter(); os.pwrite(fd, buf, i*4096); os.fdatasync(fd); lat.append(time.perf_counter()-t)
print("fallocated (unwritten extents) append+fdatasync p50 %.0f us p99 %.0f us" % (pct(lat,.5)*1e6, pct(lat,.99)*1e6))
os.close(fd)
# (b) a new file per flush: write, fsync, rename, fsync dir (what an engine WAL SST costs)
dfd = os.open(d, os.O_RDONLY); lat=[]
for i in range(n):
    t=time.perf_counter()
    f = os.open(os.path.join(d, "tmp%d"%i), os.O_WRONLY|os.O_CREAT, 0o644); os.write(f, buf); os.fsync(f); os.close(f)
    os.rename(os.path.join(d, "tmp%d"%i), os.path.join(d, "wal%d"%i)); os.fsync(dfd)
    lat.append(time.perf_counter()-t)
print("new file+fsync+rename+dir fsync p50 %.0f us p99 %.0f us" % (pct(lat,.5)*1e6, pct(lat,.99)*1e6))
