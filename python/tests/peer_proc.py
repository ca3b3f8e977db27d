"""A second client process for the tests: sets up a store on the given master and serves
line commands on stdin (put KEY HEXVALUE / get KEY / exist KEY / start KEY SIZE / quit),
answering on stdout. `start` opens a put session (the master records the put as in flight) and
leaves it open, as a writer that dies mid-put does."""

import sys

from mooncake_rs.store import MooncakeDistributedStore


def main():
    addr, segment = sys.argv[1], sys.argv[2]
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, "16MB", "tcp", "", addr)
    print("ready %d %s" % (rc, s.get_hostname()), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd = parts[0]
        if cmd == "put":
            print(s.put(parts[1], bytes.fromhex(parts[2])), flush=True)
        elif cmd == "get":
            print(s.get(parts[1]).hex() or "-", flush=True)
        elif cmd == "exist":
            print(s.is_exist(parts[1]), flush=True)
        elif cmd == "start":
            print(s.batch_put_session_start([parts[1]], [int(parts[2])])[0], flush=True)
        elif cmd == "quit":
            break
    print("closed %d" % s.close(), flush=True)


if __name__ == "__main__":
    main()
