"""A stand-in for systemd's notification socket (sd_notify(3)): binds a
datagram socket at argv[1] and appends each message's fields to argv[2],
one line each, "<seconds since start> <FIELD=value>". When READY=1 arrives
it asks the server named in the same message's STATUS ("... on HOST:PORT
...") for GET /v2/health/ready and logs "PROBE <status>": what the server
answered at the moment it said it was ready. Runs until killed."""
import http.client
import os
import re
import socket
import sys
import time

path, log = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
t0 = time.monotonic()
with open(log, "a", buffering=1) as out:
    out.write("%.3f LISTENING\n" % 0.0)
    while True:
        msg = s.recv(65536).decode("utf-8", "replace")
        fields = msg.split("\n")
        for f in fields:
            if f:
                out.write("%.3f %s\n" % (time.monotonic() - t0, f))
        if "READY=1" in fields:
            m = re.search(r"on ([0-9.]+):([0-9]+)", msg)
            status = "none"
            if m:
                host = "127.0.0.1" if m.group(1) == "0.0.0.0" else m.group(1)
                try:
                    c = http.client.HTTPConnection(host, int(m.group(2)), timeout=5)
                    c.request("GET", "/v2/health/ready")
                    status = str(c.getresponse().status)
                except OSError as e:
                    status = "error:" + e.__class__.__name__
            out.write("%.3f PROBE %s\n" % (time.monotonic() - t0, status))
