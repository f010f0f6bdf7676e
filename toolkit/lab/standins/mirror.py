#!/usr/bin/python3
"""The stock flavours' mirror (lab stand-in): serves /srv/lab-standin-mirror/<Host header>/<path> on
127.0.0.2, port 80 (http) and 443 (https, a certificate of the lab's CA for every name it answers), so
https://deb.debian.org/debian/... is deb.debian.org/debian/... there. enterprise.proxmox.com answers as
Proxmox's does: 401 Unauthorized without the subscription's credentials (apt sends them from
/etc/apt/auth.conf.d/pve.conf), the repository with them. Every request is logged, one line each, to
/run/lab-standin/mirror-requests.log (a test proves a run needed no network by an unchanged log)."""
import base64
import http.server
import json
import os
import socketserver
import ssl
import threading
import time

ROOT = "/srv/lab-standin-mirror"
TLS_DIR = "/etc/lab-standin/mirror-tls"
LOG = "/run/lab-standin/mirror-requests.log"
ENTERPRISE = "enterprise.proxmox.com"
# The subscription the host's key must match (lab.json carries what the flavour was given, if anything).
SERVER_ID = "4C4B5354414E44494E5F4C4142000000"
KEY = "pve4s-labstandin0"
_log_lock = threading.Lock()


class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path: str) -> str:
        host = (self.headers.get("Host") or "").split(":")[0]
        rel = super().translate_path(path)[len(os.getcwd()):]
        return os.path.join(ROOT, os.path.basename(host), rel.lstrip("/"))

    def _host(self) -> str:
        return (self.headers.get("Host") or "").split(":")[0]

    def _authorised(self) -> bool:
        if self._host() != ENTERPRISE:
            return True
        expected = base64.b64encode(f"{SERVER_ID}:{KEY}".encode()).decode()
        return self.headers.get("Authorization", "") == f"Basic {expected}"

    def _refuse(self) -> bool:
        if self._authorised():
            return False
        self.send_response(401, "Unauthorized")
        self.send_header("WWW-Authenticate", 'Basic realm="Proxmox Enterprise Repository"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_GET(self) -> None:
        if not self._refuse():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._refuse():
            super().do_HEAD()

    def log_request(self, code: object = "-", size: object = "-") -> None:
        line = json.dumps({"t": round(time.time(), 3), "scheme": getattr(self.server, "scheme", "http"),
                           "host": self._host(), "path": self.path, "status": str(code)})
        with _log_lock, open(LOG, "a") as fh:
            fh.write(line + "\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    scheme = "http"


os.chdir("/")
plain = Server(("127.0.0.2", 80), Handler)
secure = Server(("127.0.0.2", 443), Handler)
secure.scheme = "https"
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(os.path.join(TLS_DIR, "server.crt"), os.path.join(TLS_DIR, "server.key"))
secure.socket = context.wrap_socket(secure.socket, server_side=True)
threading.Thread(target=plain.serve_forever, daemon=True).start()
secure.serve_forever()
