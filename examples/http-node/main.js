// A Handoff handler written with Node.js's http module only: the sidecar
// POSTs each order to /events in CloudEvents binary mode (ce-* headers, the
// order as the body), and the status of the answer says what becomes of it.
'use strict';
const http = require('http');

// The ce-id of every event handled. The sidecar narrows duplicates, but a
// producer's resend or a redelivery after a lost answer still reaches the
// app, which must not do the work twice. A real service keeps this in its
// database, written in the same transaction as the work (Node runs one
// handler at a time, so here the check and the record cannot interleave).
const done = new Set();

function handle(req, body) {
  // Binary mode: the attributes are ce-* headers, the data is the body. A
  // CloudEvents SDK (the cloudevents package, HTTP.toEvent({ headers, body }))
  // would read them into an event, and a framework (Express, Fastify) would
  // stand where http.createServer does; neither is needed.
  const id = req.headers['ce-id'];
  const attempt = Number(req.headers['handoff-attempt']);
  const deadline = Date.parse(req.headers['handoff-deadline']);
  if (req.headers['handoff-redelivered'] === 'true') {
    // A previous attempt may have done the work and lost its answer.
    console.log(`redelivered event ${id} (attempt ${attempt}): it may have been handled already`);
  }
  let order;
  try {
    order = JSON.parse(body);
  } catch (err) {
    return { status: 422, detail: `not an order: ${err.message}` };
  }

  if (done.has(id)) {
    // Handled before: answer 2xx again, without doing it again.
    console.log(`duplicate ${order.id} (event ${id}): already handled, answering 200 again`);
    return { status: 200 };
  }
  if (order.kind === 'bad') {
    // Permanent: dead-lettered at once; the body is the evidence.
    console.log(`rejected ${order.id}: unknown product`);
    return { status: 422, detail: 'unknown product' };
  }
  if (order.kind === 'flaky' && attempt === 1) {
    // Transient: a dependency is down; retried after Retry-After.
    console.log(`busy ${order.id} (attempt ${attempt}): 503, Retry-After 1`);
    return { status: 503, headers: { 'Retry-After': '1' }, detail: 'stock service busy' };
  }
  if (order.kind === 'early' && attempt === 1) {
    // A precondition not met yet. A 404 alone would be dead-lettered as
    // permanent; Handoff-Outcome: defer (or a 409) says "try again later",
    // not counted as a failed attempt.
    console.log(`deferred ${order.id} (attempt ${attempt}): payment not confirmed yet`);
    return { status: 404, headers: { 'Handoff-Outcome': 'defer', 'Retry-After': '1' }, detail: 'payment not confirmed yet' };
  }
  // Handoff-Deadline is when the sidecar stops trying: close to it, do only
  // what must be done, so that the answer is back in time.
  const left = Math.round((deadline - Date.now()) / 1000);
  done.add(id);
  console.log(`handled ${order.id} (event ${id}, attempt ${attempt}, deadline in ${left}s, email sent ${left > 30})`);
  return { status: 200 };
}

const server = http.createServer((req, res) => {
  if (req.method !== 'POST' || req.url !== '/events') {
    res.writeHead(404).end('no such path');
    return;
  }
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const { status, headers = {}, detail = '' } = handle(req, Buffer.concat(chunks).toString());
    res.writeHead(status, { 'Content-Type': 'text/plain', ...headers }).end(detail);
  });
});

const flag = process.argv.indexOf('--listen');
const [host, port] = (flag > 0 ? process.argv[flag + 1] : '127.0.0.1:8080').split(':');
server.listen(Number(port), host, () => {
  console.log(`order service listening on http://${host}:${port}/events`);
});
