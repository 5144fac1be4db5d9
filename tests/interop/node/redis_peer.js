// A Node.js Redis lock peer for tests/interop/test_redis_peers.py, on the
// line protocol of tests/interop/conftest.py ("held <t>", "busy",
// "waiting", "released <t>", "error <text>"; reads "release").
//   node redis_peer.js redlock|mutex hold|try|wait NAME HOST:PORT[,HOST:PORT...] [RETRY_MS]
// redlock: node-redlock 4 over every host (quorum); mutex: redis-semaphore's
// Mutex on the first host (its key "mutex:NAME"). t is CLOCK_MONOTONIC
// seconds (process.hrtime: the same clock as Python's time.monotonic()).
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');
const { Mutex } = require('redis-semaphore');
const readline = require('readline');

const [kind, mode, name, hostList, retryArg] = process.argv.slice(2);
const retryMs = Number(retryArg || 5);
const now = () => (Number(process.hrtime.bigint()) / 1e9).toFixed(6);
const say = (...w) => process.stdout.write(w.join(' ') + '\n');
const clients = hostList.split(',').map((hp) => {
  const [host, port] = hp.split(':');
  return new Redis({ host, port: Number(port), lazyConnect: false, maxRetriesPerRequest: 1 });
});

async function take(blocking) {
  if (kind === 'redlock') {
    const rl = new Redlock(clients, {
      retryCount: blocking ? 4000 : 0, retryDelay: retryMs, retryJitter: 0, driftFactor: 0.01,
    });
    try {
      const lock = await rl.lock(name, 30000);
      return { release: () => lock.unlock() };
    } catch (e) {
      if (e && e.name === 'LockError') return null;
      throw e;
    }
  }
  const m = new Mutex(clients[0], name, {
    lockTimeout: 30000, acquireTimeout: blocking ? 20000 : 1, acquireAttemptsLimit: blocking ? Infinity : 1,
    retryInterval: retryMs, refreshInterval: 0,
  });
  if (!(await m.tryAcquire())) {
    if (!blocking) return null;
    await m.acquire();
  }
  return { release: () => m.release() };
}

(async () => {
  try {
    if (mode === 'wait') say('waiting');
    const held = await take(mode !== 'try');
    if (!held) {
      say('busy');
    } else {
      say('held', now());
      const rl = readline.createInterface({ input: process.stdin });
      for await (const line of rl) {
        if (line.trim() === 'release') break;
      }
      await held.release();
      say('released', now());
    }
  } catch (e) {
    say('error', String(e && e.message ? e.message : e).replace(/\n/g, ' '));
  }
  clients.forEach((c) => c.disconnect());
})();
