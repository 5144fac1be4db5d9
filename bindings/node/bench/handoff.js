#!/usr/bin/env node
'use strict';
// Release-to-next-holder handoff as a Node.js user sees it:
//   node bench/handoff.js URI [N]
// Two clients in this process ping-pong one lock N times (default 500):
// the waiter's acquire is pending, the holder waits 1 ms (as `dlock bench`
// does, so the waiter is blocked in the store), stamps t0 and calls
// release(); the sample is t0 to the waiter's promise resolving on the
// main thread. Compare with the "handoff, ping-pong" line of
//   BUILD/tools/dlock bench --handoffs N --waiters 2 --iterations 200 URI
// (the same measure in C, whose waits are also deadline waits, as here):
// the difference is the binding's overhead (a queue hop to each client's
// thread and back through the event loop).
const dlock = require('..');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Same rule as bench/bench_util.c: index floor(p/100 * (n-1)) of the sorted samples.
function pct(sorted, p) {
  return sorted[Math.floor((sorted.length - 1) * p / 100)];
}

async function main() {
  const [uri, nArg] = process.argv.slice(2);
  if (!uri) {
    console.error('usage: handoff.js URI [N]');
    process.exit(2);
  }
  const n = nArg === undefined ? 500 : Number(nArg);
  if (!Number.isInteger(n) || n < 1) throw new TypeError('N must be a positive integer');
  const clients = [await dlock.open(uri), await dlock.open(uri)];
  const name = `node-bench-${process.pid}-${Date.now()}`;
  const samples = [];
  try {
    let held = await clients[0].acquire(name);
    for (let k = 0; k < n; k++) {
      const waiter = clients[(k + 1) % 2];
      let t1 = 0n;
      const next = waiter.acquire(name, { wait: 60000 }).then((l) => { t1 = process.hrtime.bigint(); return l; });
      await sleep(1);
      const t0 = process.hrtime.bigint();
      const released = held.release();
      held = await next;
      await released;
      samples.push(Number(t1 - t0) / 1000);
    }
    await held.release();
  } finally {
    for (const c of clients) await c.close();
  }
  samples.sort((a, b) => a - b);
  const mean = samples.reduce((s, v) => s + v, 0) / samples.length;
  const f = (v) => v.toFixed(1);
  console.log(`node ${process.version}, libdlock ${dlock.version} (${dlock.library})`);
  console.log(`store ${clients[0].backend}: ${n} handoffs, ping-pong between two clients`);
  console.log(`handoff us: p50 ${f(pct(samples, 50))}  p90 ${f(pct(samples, 90))}  ` +
              `p99 ${f(pct(samples, 99))}  mean ${f(mean)}  max ${f(samples[samples.length - 1])}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
