#!/usr/bin/python3
"""The stock flavour's mirror (lab stand-in): serves /srv/lab-standin-mirror/<Host header>/<path>
on 127.0.0.2:80, so http://deb.debian.org/debian/... is deb.debian.org/debian/... there."""
import http.server
import os
import socketserver

ROOT = "/srv/lab-standin-mirror"


class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path: str) -> str:
        host = (self.headers.get("Host") or "").split(":")[0]
        rel = super().translate_path(path)[len(os.getcwd()):]
        return os.path.join(ROOT, os.path.basename(host), rel.lstrip("/"))

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


os.chdir("/")
Server(("127.0.0.2", 80), Handler).serve_forever()
