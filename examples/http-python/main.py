#!/usr/bin/env python3
"""A Handoff handler written with Python's standard library only.

The sidecar POSTs each order to /events in CloudEvents binary mode, or
several at once in batched mode; each answer says what becomes of the order.
"""
import argparse
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The ce-id of every event handled. The sidecar narrows duplicates, but a
# producer's resend or a redelivery after a lost answer still reaches the
# app, which must not do the work twice. A real service keeps this in its
# database, written in the same transaction as the work; the lock stands
# for that transaction.
done = set()
lock = threading.Lock()


def log(line):
    print(line, flush=True)


def handle(event_id, attempt, deadline, redelivered, order):
    """Takes one order; returns (status, Retry-After seconds or None, detail)."""
    if redelivered:
        # A previous attempt may have done the work and lost its answer.
        log(f"redelivered event {event_id} (attempt {attempt}): it may have been handled already")
    with lock:
        if event_id in done:
            # Handled before: answer 2xx again, without doing it again.
            log(f"duplicate {order['id']} (event {event_id}): already handled, answering 200 again")
            return 200, None, ""
        if order["kind"] == "bad":
            # Permanent: dead-lettered at once; the detail is the evidence.
            log(f"rejected {order['id']}: unknown product")
            return 422, None, "unknown product"
        if order["kind"] == "flaky" and attempt == 1:
            # Transient: a dependency is down; retried after Retry-After.
            log(f"busy {order['id']} (attempt {attempt}): 503, Retry-After 1")
            return 503, 1, "stock service busy"
        if order["kind"] == "early" and attempt == 1:
            # A precondition not met yet: 409 (or Handoff-Outcome: defer) tries
            # again later, not counted as a failed attempt.
            log(f"deferred {order['id']} (attempt {attempt}): payment not confirmed yet")
            return 409, 1, "payment not confirmed yet"
        # Handoff-Deadline is when the sidecar stops trying: close to it, do
        # only what must be done, so that the answer is back in time.
        left = round((deadline - datetime.now(timezone.utc)).total_seconds())
        done.add(event_id)
        log(f"handled {order['id']} (event {event_id}, attempt {attempt}, deadline in {left}s, email sent {left > 30})")
        return 200, None, ""


def when(value):
    # fromisoformat reads the trailing Z only from Python 3.11 on.
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Events(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the sidecar reuses connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/events":
            return self.answer(404, "no such path")
        if self.headers.get_content_type() == "application/cloudevents-batch+json":
            return self.batch(json.loads(body))
        # Binary mode: the attributes are ce-* headers, the data is the body.
        # A CloudEvents SDK (the cloudevents package, from_http(headers, body))
        # would read them into an event, and a framework (Flask, FastAPI)
        # would stand where BaseHTTPRequestHandler does; neither is needed.
        try:
            order = json.loads(body)
        except ValueError as err:
            return self.answer(422, f"not an order: {err}")
        h = self.headers
        status, retry_after, detail = handle(h["ce-id"], int(h["Handoff-Attempt"]), when(h["Handoff-Deadline"]),
                                             h.get("Handoff-Redelivered") == "true", order)
        self.answer(status, detail, retry_after)

    def batch(self, events):
        # Batched mode: a JSON array of structured events, with the Handoff-*
        # headers as string extensions and the order as data. The answer is
        # 200 with one result per event, matched by id; an event left out
        # counts as unknown and comes back flagged redelivered.
        log(f"batch of {len(events)} events")
        results = []
        for ev in events:
            status, retry_after, detail = handle(ev["id"], int(ev["handoffattempt"]), when(ev["handoffdeadline"]),
                                                 ev["handoffredelivered"] == "true", ev["data"])
            result = {"id": ev["id"], "status": status, "detail": detail}
            if retry_after:
                result["retry_after"] = retry_after
            results.append(result)
        self.answer(200, json.dumps({"results": results}), content_type="application/json")

    def answer(self, status, body, retry_after=None, content_type="text/plain"):
        data = body.encode()
        self.send_response(status)
        if retry_after:
            self.send_header("Retry-After", str(retry_after))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        pass  # the order log above says what happened


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8080", help="address to serve POST /events on")
    host, port = parser.parse_args().listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), Events)
    log(f"order service listening on http://{host}:{port}/events")
    server.serve_forever()
