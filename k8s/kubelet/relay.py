"""A TCP relay from the tier's bridge to the apiserver on the host's loopback.

The kubelets live in network namespaces of their own, where 127.0.0.1 is their own loopback; the
apiserver tier listens on the host's 127.0.0.1 only. The TLS session passes through untouched.
Usage: relay.py LISTEN_IP:PORT TARGET_PORT READY_FILE
"""

import socket
import socketserver
import sys
import threading
from pathlib import Path


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Relay(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    target_port = 0


class Handler(socketserver.BaseRequestHandler):
    server: Relay

    def handle(self) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.server.target_port), timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
        back.start()
        pump(self.request, upstream)
        back.join()
        upstream.close()


def main() -> None:
    listen, target, ready = sys.argv[1:]
    host, port = listen.rsplit(":", 1)
    with Relay((host, int(port)), Handler) as server:
        server.target_port = int(target)
        Path(ready).touch()
        server.serve_forever()


if __name__ == "__main__":
    main()
