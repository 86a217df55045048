"""The health probes of a role's node > 0 (`serve … --nodes N --node-rank K`): it holds training ranks
only, no service, yet its pod is probed like node 0's. Its first rank answers `/healthz` and `/readyz`
on the service's port while it is in the group; when the group breaks the process exits, and with it
the answers."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        known = self.path in ("/healthz", "/readyz")
        body = json.dumps(
            {
                "status": "ok",
                "rank": int(os.environ.get("RANK", "0")),
                "world": int(os.environ.get("WORLD_SIZE", "1")),
            }
            if known
            else {
                "detail": "a training node answers /healthz and /readyz only; its role's service is on node 0"
            }
        ).encode()
        self.send_response(200 if known else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: not logged
        pass


def serve_health(host: str, port: int) -> ThreadingHTTPServer:
    """Answer the probes on host:port from a daemon thread; returns the server."""
    server = ThreadingHTTPServer((host, port), _Health)
    threading.Thread(target=server.serve_forever, name="node-health", daemon=True).start()
    return server
