"""`python -m bench.otlp_sink --port P`: an OTLP/HTTP traces endpoint that keeps nothing.

The tracing figure exports to it so the exporter's cost is real (protobuf encoding, an HTTP
POST per batch, the answer read back) while no collector competes for the CPU being measured:
it runs as a process of its own, decodes each `ExportTraceServiceRequest` only to count its
spans (the figure's proof that the sampler kept the share it was asked to), answers an empty
`ExportTraceServiceResponse` and drops the request. `GET /count` returns the counts as JSON.
Binds to loopback only; span contents are never written anywhere.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_LOCK = threading.Lock()
_COUNTS = {"requests": 0, "spans": 0, "bytes": 0, "undecodable": 0}
_EMPTY_ANSWER = ExportTraceServiceResponse().SerializeToString()


def count_spans(body: bytes) -> int:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector answers the exporter's session

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            spans, bad = count_spans(body), 0
        except Exception:  # a body the sink cannot read is counted, never fatal
            spans, bad = 0, 1
        with _LOCK:
            _COUNTS["requests"] += 1
            _COUNTS["spans"] += spans
            _COUNTS["bytes"] += len(body)
            _COUNTS["undecodable"] += bad
        self._answer(200, "application/x-protobuf", _EMPTY_ANSWER)

    def do_GET(self) -> None:
        if self.path != "/count":
            self._answer(404, "text/plain", b"")
            return
        with _LOCK:
            out = json.dumps(_COUNTS).encode()
        self._answer(200, "application/json", out)

    def _answer(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # one line per batch would only cost CPU


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.otlp_sink")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
