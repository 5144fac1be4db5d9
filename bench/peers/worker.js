// One client of a Node.js peer lock library, driven by bench/peers/run.py,
// on the JSON-line protocol of bench/peers/worker.py (solo, hold, wait,
// release, quit; times are CLOCK_MONOTONIC ns from process.hrtime).
//   node worker.js redlock|redis-semaphore URI
// redlock: node-redlock 4 over every host of the URI (a quorum), with its
// default retries (retryDelay 200 ms); redis-semaphore: its Mutex on the
// first host, with its defaults (retryInterval 10 ms). The packages come
// from tests/interop/node (npm ci from its lock file; NODE_PATH).
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');
const { Mutex } = require('redis-semaphore');
const readline = require('readline');

const [kind, uri] = process.argv.slice(2);
const TTL_MS = 30000;
const hosts = uri.replace(/^redis:\/\//, '').split('/')[0].split('@').pop().split(',');
const say = (o) => process.stdout.write(JSON.stringify(Object.assign({ ok: true }, o)) + '\n');
const now = () => Number(process.hrtime.bigint());
const clients = hosts.map((hp) => {
  const i = hp.lastIndexOf(':');
  return new Redis({ host: hp.slice(0, i), port: Number(hp.slice(i + 1)), maxRetriesPerRequest: 1 });
});
let held = null;

async function take(name, blocking) {
  if (kind === 'redlock') {
    const rl = blocking ? new Redlock(clients) : new Redlock(clients, { retryCount: 0 });
    try {
      const lock = await rl.lock('peers:' + name, TTL_MS);
      return () => lock.unlock();
    } catch (e) {
      if (!blocking && e && e.name === 'LockError') return null;
      throw e;
    }
  }
  const m = new Mutex(clients[0], 'peers-' + name, { lockTimeout: TTL_MS, refreshInterval: 0 });
  if (!blocking) return (await m.tryAcquire()) ? () => m.release() : null;
  await m.acquire();
  return () => m.release();
}

async function handle(cmd) {
  if (cmd.op === 'solo') {
    const ns = [];
    const warm = Math.max(5, Math.floor(cmd.n / 10));
    for (let i = 0; i < warm + cmd.n; i++) {
      const t = now();
      const rel = await take(cmd.name, false);
      if (!rel) throw new Error('an uncontended try was refused');
      await rel();
      if (i >= warm) ns.push(now() - t);
    }
    say({ ns });
  } else if (cmd.op === 'hold' || cmd.op === 'wait') {
    if (cmd.op === 'wait') say({ about: 1 });
    held = await take(cmd.name, true);
    say({ t1: now() });
  } else if (cmd.op === 'release') {
    const t0 = now();
    await held();
    held = null;
    say({ t0 });
  }
}

(async () => {
  try {
    await Promise.all(clients.map((c) => c.ping()));
  } catch (e) {
    process.stdout.write(JSON.stringify({ ok: false, error: 'open: ' + String(e.message || e) }) + '\n');
    process.exit(1);
  }
  say({ ready: 1 });
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const cmd = JSON.parse(line);
    if (cmd.op === 'quit') break;
    try {
      await handle(cmd);
    } catch (e) {
      const msg = String(e && e.message ? e.message : e).replace(/\n/g, ' ');
      process.stdout.write(JSON.stringify({ ok: false, error: cmd.op + ': ' + msg }) + '\n');
    }
  }
  process.exit(0);
})();

