"""Holds slow clients open against a host for a while: the load under which `make bench` times
GET /api/health.

Usage: slow_clients.py HOST PORT readers|flood COUNT SECONDS

- readers: COUNT connections ask for the user list with a 4 KiB receive buffer and never read it;
- flood: COUNT connections send half a request head and COUNT announce a 1 MiB body and send
  10 bytes; any the host closes are opened again, so the flood lasts SECONDS.
"""
import resource
import socket
import sys
import time

host, port, mode, count, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

LIST = b"GET /api/users HTTP/1.1\r\nHost: bench\r\n\r\n"
HALF_HEAD = b"GET /api/health HTTP/1.1\r\nHost: bench\r\n"
HALF_BODY = (b"POST /api/users HTTP/1.1\r\nHost: bench\r\ncontent-type: application/json\r\n"
             b"content-length: 1048576\r\n\r\n{\"name\":\"")


def open_one(request, small_buffer=False):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if small_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    try:
        sock.sendall(request)
    except OSError:
        pass
    sock.setblocking(False)
    return sock


def closed(sock):
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


if mode == "readers":
    kinds = [(LIST, True)] * count
elif mode == "flood":
    kinds = [(HALF_HEAD, False), (HALF_BODY, False)] * count
else:
    sys.exit(f"unknown mode {mode}")
socks = [open_one(request, small) for request, small in kinds]
until = time.monotonic() + seconds
reopened = 0
while time.monotonic() < until:
    time.sleep(0.5)
    if mode != "flood":
        continue
    for index, sock in enumerate(socks):
        if closed(sock):
            sock.close()
            socks[index] = open_one(*kinds[index])
            reopened += 1
print(f"{mode}: {len(socks)} connections held for {seconds:.0f} s, {reopened} reopened", file=sys.stderr)
