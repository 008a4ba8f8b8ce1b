"""A protobuf-only OTLP/HTTP trace receiver for the tests, decoding with the official proto definitions.

It answers POST /v1/traces as a collector does, but only for Content-Type application/x-protobuf (415 for anything
else, JSON included), decodes each request with opentelemetry-proto's generated classes, and keeps every span.
GET /spans returns them as JSON; GET /requests says what was POSTed (content types, statuses). With --fail-first N
the first N protobuf requests get a 500 (not retried by exporters), to see an exporter recover.

Prints "listening <port>" once it listens on 127.0.0.1 (port 0: a free one); ends on SIGTERM or when its standard
input closes, so it never outlives the test that started it.
"""

import argparse
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"


def any_value(value):
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def decode(body):
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "traceId": span.trace_id.hex(),
                        "spanId": span.span_id.hex(),
                        "parentSpanId": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "startTimeUnixNano": span.start_time_unix_nano,
                        "attributes": attributes(span.attributes),
                        "links": [
                            {"traceId": link.trace_id.hex(), "spanId": link.span_id.hex()}
                            for link in span.links
                        ],
                        "scope": scope_spans.scope.name,
                        "resource": resource,
                    }
                )
    return spans


class State:
    def __init__(self, fail_first):
        self.lock = threading.Lock()
        self.spans = []
        self.requests = []
        self.fail_first = fail_first


def handler_for(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, content_type, body):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            with state.lock:
                if self.path == "/spans":
                    body = json.dumps(state.spans)
                elif self.path == "/requests":
                    body = json.dumps(state.requests)
                else:
                    return self.reply(404, "text/plain", b"not found")
            self.reply(200, "application/json", body.encode())

        def read_body(self):
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            # Node's exporters stream the body: chunked, no Content-Length.
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()

        def do_POST(self):
            body = self.read_body()
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            record = {"path": self.path, "contentType": content_type, "bytes": len(body)}
            if self.path != "/v1/traces":
                status = 404
            elif content_type != PROTOBUF:
                status = 415
            else:
                with state.lock:
                    failing = state.fail_first > 0
                    if failing:
                        state.fail_first -= 1
                status = 500 if failing else 200
            if status == 200:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    spans = decode(body)
                except Exception as err:  # a body the official definitions cannot read is the exporter's bug
                    record["status"] = 400
                    record["error"] = str(err)
                    with state.lock:
                        state.requests.append(record)
                    return self.reply(400, "text/plain", b"undecodable ExportTraceServiceRequest")
                with state.lock:
                    state.spans.extend(spans)
            record["status"] = status
            with state.lock:
                state.requests.append(record)
            if status == 200:
                self.reply(200, PROTOBUF, ExportTraceServiceResponse().SerializeToString())
            else:
                self.reply(status, "text/plain", b"this receiver takes application/x-protobuf only")

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(State(args.fail_first)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"listening {server.server_address[1]}", flush=True)
    # The test holds our standard input open: when it goes (the test ended, however), so do we.
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
