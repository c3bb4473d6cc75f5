"""A flood at a store port: COUNT connections that never say hello, reopened as the server closes
them, for at most SECONDS (bench/init_burst.sh FLOOD=COUNT). Loopback or a test namespace only.

Usage: store_flood.py HOST PORT COUNT SECONDS
"""
import resource
import selectors
import socket
import sys
import time

host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 64)), hard))
end = time.monotonic() + seconds
sel = selectors.DefaultSelector()
opened = closed = 0


def open_one():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, port))  # the store may not listen yet: a refusal is seen as a close
    sel.register(s, selectors.EVENT_READ)
    opened += 1


for _ in range(count):
    open_one()
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.2):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data:
            continue  # a kBusy answer: the close follows
        sel.unregister(s)
        s.close()
        closed += 1
        time.sleep(0.01)  # no tighter than a scanner: a refused port is not hammered
        open_one()
print(f"store_flood: {opened} connections opened, {closed} closed by the server", file=sys.stderr)
