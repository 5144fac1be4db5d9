'use strict';
// Leader election through the package (client.campaign, leader, observe),
// against file:// and every store whose URI is in the environment, as
// stores.test.js. A networked store whose backend has no elections skips
// them; file:// must have them.
const { describe, test: nodeTest } = require('node:test');
const test = (name, ...rest) => {
  const fn = rest.pop();
  return nodeTest(name, { timeout: 60000, ...rest[0] }, fn);
};
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const dlock = require('..');
const { stores, lockName, sleep, isDlock } = require('./helpers');

// Opens n clients, runs fn(...clients), closes them whatever happens; the
// case is skipped where the store has no elections (file:// must).
async function withClients(t, store, n, fn) {
  const clients = [];
  try {
    for (let i = 0; i < n; i++) clients.push(await dlock.open(store.uri));
    if (!clients[0].caps.election) {
      assert.ok(store.networked, `${clients[0].backend} declares DLOCK_CAP_ELECTION`);
      t.skip(`${clients[0].backend} has no elections`);
      return undefined;
    }
    return await fn(...clients);
  } finally {
    for (const c of clients) await c.close();
  }
}

// The next change an iterator yields, or a failure after ms.
async function nextChange(it, ms = 10000, what = 'a change') {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms);
  });
  try {
    const r = await Promise.race([it.next(), timeout]);
    assert.equal(r.done, false, `the observer ended instead of reporting ${what}`);
    return r.value;
  } finally {
    clearTimeout(timer);
  }
}

// Settled within ms? (true/false, without waiting longer)
async function settles(p, ms) {
  let settled = false;
  p.then(() => { settled = true; }, () => { settled = true; });
  await sleep(ms);
  return settled;
}

for (const store of stores()) {
  describe(`election ${store.label}`, { skip: store.skip }, () => {
    test('campaign, leader, proclaim, resign', async (t) => {
      await withClients(t, store, 2, async (a, b) => {
        const name = lockName('elect');
        const none = await b.leader(name);
        assert.equal(none.held, false);
        assert.equal(none.name, name);
        assert.equal(none.term, 0n);
        assert.equal(none.value.length, 0);

        const l = await a.campaign(name, { value: 'host-a:8080', ttl: 10000 });
        assert.ok(l instanceof dlock.Leadership && l instanceof dlock.Lock);
        assert.equal(typeof l.term, 'bigint');
        assert.ok(l.term > 0n, `term ${l.term}`);
        assert.equal(l.term, l.token);
        assert.equal(l.name, name);
        assert.equal(l.lost, null);
        assert.deepEqual(l.value, Buffer.from('host-a:8080'));

        let now = await b.leader(name);
        assert.equal(now.held, true);
        assert.equal(now.term, l.term);
        assert.ok(Buffer.isBuffer(now.value));
        assert.equal(now.value.toString(), 'host-a:8080');
        assert.ok(now.leaseMs === null || typeof now.leaseMs === 'number');
        assert.ok(now.owner === null || /^[0-9a-f]+$/.test(now.owner), `owner ${now.owner}`);
        // The name is taken: a plain lock waits like any other candidate.
        await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        await assert.rejects(b.campaign(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));

        // Bytes as given, NUL included.
        const bytes = Buffer.from([0, 1, 2, 0xff, 0]);
        await l.proclaim(bytes);
        assert.deepEqual(l.value, bytes);
        now = await b.leader(name);
        assert.deepEqual(now.value, bytes);
        assert.equal(now.term, l.term, 'proclaim keeps the term');
        await l.proclaim(new Uint8Array([104, 105]));
        assert.equal((await b.leader(name)).value.toString(), 'hi');

        await l.resign();
        assert.equal(l.released, true);
        now = await b.leader(name);
        assert.equal(now.held, false);
        assert.equal(now.value.length, 0);
        await assert.rejects(l.proclaim('late'), isDlock('DLOCK_EINVAL'));
        await assert.rejects(l.resign(), isDlock('DLOCK_EINVAL'));
      });
    });

    test('two candidates: the second leads once the first resigns, with a higher term',
         async (t) => {
      await withClients(t, store, 2, async (a, b) => {
        const name = lockName('elect-two');
        const first = await a.campaign(name, { value: 'a' });
        let ticks = 0;
        const timer = setInterval(() => ticks++, 10);
        const second = b.campaign(name, { value: Buffer.from('b'), wait: 20000 });
        try {
          assert.equal(await settles(second, 400), false, 'the second waits while the first leads');
          assert.ok(ticks >= 15, `the loop ticked ${ticks} times during the campaign`);
        } finally {
          clearInterval(timer);
        }
        assert.equal((await a.leader(name)).value.toString(), 'a');
        await first.resign();
        const l = await second;
        assert.ok(l.term > first.term, `term ${l.term} > ${first.term}`);
        const now = await a.leader(name);
        assert.equal(now.term, l.term);
        assert.equal(now.value.toString(), 'b');
        await l.release(); // a leadership's release() resigns
        assert.equal((await a.leader(name)).held, false);
      });
    });

    test('an observer sees each change in order (value and term), then no leader',
         async (t) => {
      await withClients(t, store, 3, async (a, b, c) => {
        const name = lockName('observe');
        const obs = await c.observe(name);
        assert.ok(obs instanceof dlock.Observer);
        assert.equal(obs.name, name);
        const events = [];
        obs.on('change', (ch) => events.push(ch));
        const it = obs[Symbol.asyncIterator]();
        try {
          let ch = await nextChange(it, 10000, 'the first state');
          assert.equal(ch.held, false);
          assert.equal(ch.error, undefined);

          const la = await a.campaign(name, { value: 'v1' });
          ch = await nextChange(it, 10000, 'the first leader');
          assert.equal(ch.held, true);
          assert.equal(ch.term, la.term);
          assert.equal(ch.value.toString(), 'v1');
          assert.equal(ch.name, name);

          await la.proclaim('v2');
          ch = await nextChange(it, 10000, 'the proclaimed value');
          assert.equal(ch.held, true);
          assert.equal(ch.term, la.term);
          assert.equal(ch.value.toString(), 'v2');

          await la.resign();
          ch = await nextChange(it, 10000, 'no leader after resign');
          assert.equal(ch.held, false);
          assert.equal(ch.value.length, 0);

          const lb = await b.campaign(name, { value: 'v3' });
          ch = await nextChange(it, 10000, 'the second leader');
          assert.equal(ch.held, true);
          assert.equal(ch.term, lb.term);
          assert.ok(ch.term > la.term);
          assert.equal(ch.value.toString(), 'v3');
          await lb.resign();
          ch = await nextChange(it, 10000, 'no leader after the second resign');
          assert.equal(ch.held, false);

          // The events saw the same sequence as the iterator.
          assert.deepEqual(events.map((e) => [e.held, e.term, e.value.toString()]),
                           [[false, 0n, ''], [true, la.term, 'v1'], [true, la.term, 'v2'],
                            [false, 0n, ''], [true, lb.term, 'v3'], [false, 0n, '']]);
        } finally {
          obs.close();
        }
      });
    });

    test('a campaign times out, is refused on try, and is cancelled by its signal',
         async (t) => {
      await withClients(t, store, 3, async (a, b, c) => {
        const name = lockName('elect-cancel');
        const held = await a.campaign(name, { value: 'a' });
        let t0 = Date.now();
        await assert.rejects(b.campaign(name, { value: 'b', wait: 300 }),
                             isDlock('DLOCK_ETIMEDOUT'));
        let took = Date.now() - t0;
        assert.ok(took >= 250 && took < 5000, `wait: 300 took ${took} ms`);
        await assert.rejects(b.campaign(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        const reason = new Error('not wanted');
        await assert.rejects(b.campaign(name, { signal: AbortSignal.abort(reason) }),
                             (e) => e === reason);

        const ac = new AbortController();
        const cancelled = b.campaign(name, { value: 'b', signal: ac.signal });
        await sleep(200);
        t0 = Date.now();
        ac.abort();
        await assert.rejects(cancelled, (e) => e === ac.signal.reason && e.name === 'AbortError');
        took = Date.now() - t0;
        assert.ok(took < 3000, `the campaign ended ${took} ms after abort`);
        // Nothing left behind: the next candidate leads once a resigns.
        const next = c.campaign(name, { value: 'c', wait: 10000 });
        await held.resign();
        const l = await next;
        assert.equal((await a.leader(name)).value.toString(), 'c');
        assert.ok(l.term > held.term);
        // close() ends a campaign of the same client.
        const closing = assert.rejects(b.campaign(name, { wait: 'forever' }),
                                       isDlock('DLOCK_ECANCELED'));
        await sleep(200);
        await b.close();
        await closing;
        await l.resign();
      });
    });

    test('close() of an observer ends its iteration and its events', async (t) => {
      await withClients(t, store, 2, async (a, b) => {
        const name = lockName('observe-close');
        const obs = await b.observe(name);
        let events = 0;
        let closed = 0;
        obs.on('change', () => events++);
        obs.on('close', () => closed++);
        const seen = [];
        const loop = (async () => {
          for await (const ch of obs) seen.push(ch.held);
        })();
        const t0 = Date.now();
        while (events === 0 && Date.now() - t0 < 10000) await sleep(10);
        assert.equal(events, 1, 'the first state came');
        assert.equal(obs.closed, false);
        obs.close();
        assert.equal(obs.closed, true);
        assert.equal(closed, 1);
        await loop; // the for-await ends
        assert.deepEqual(seen, [false]);
        const l = await a.campaign(name, { value: 'x' });
        await sleep(500);
        assert.equal(events, 1, 'no change reported after close()');
        obs.close(); // twice is harmless
        assert.equal(closed, 1);
        const after = await obs[Symbol.asyncIterator]().next();
        assert.equal(after.done, true);
        await l.resign();

        // Leaving a for-await loop closes the observer.
        const obs2 = await b.observe(name);
        for await (const ch of obs2) {
          assert.equal(typeof ch.held, 'boolean');
          break;
        }
        assert.equal(obs2.closed, true);
        // An observer outlives its client.
        const c = await dlock.open(store.uri);
        const obs3 = await c.observe(name);
        await c.close();
        const it = obs3[Symbol.asyncIterator]();
        assert.equal((await nextChange(it)).held, false);
        const l2 = await a.campaign(name, { value: 'y' });
        assert.equal((await nextChange(it)).term, l2.term);
        obs3.close();
        await l2.resign();
      });
    });

    test('a leadership lost reports it (event, .lost) and refuses proclaim', async (t) => {
      if (store.networked) {
        t.skip('the lock file is removed on the file store only');
        return;
      }
      await withClients(t, store, 2, async (a, b) => {
        const name = lockName('elect-lost');
        const l = await a.campaign(name, { value: 'v', ttl: 1000 });
        const lost = new Promise((resolve) => l.once('lost', resolve));
        const file = path.join(new URL(store.uri).pathname, `${name}.lock`);
        assert.ok(fs.existsSync(file), `${file} is the leader's lock file`);
        fs.rmSync(file); // the lock is no longer ours
        const err = await Promise.race([lost, sleep(10000).then(() => null)]);
        assert.ok(err, "no 'lost' event within 10 s");
        assert.ok(err instanceof dlock.DlockError);
        assert.equal(err.code, 'DLOCK_ELOST');
        assert.equal(l.lost, 'DLOCK_ELOST');
        await assert.rejects(l.proclaim('late'), isDlock('DLOCK_ELOST'));
        // The next candidate leads, with a higher term.
        const next = await b.campaign(name, { value: 'w', wait: 5000 });
        assert.ok(next.term > l.term);
        await assert.rejects(l.resign(), isDlock('DLOCK_ELOST'));
        await next.resign();
      });
    });

    test('an observer dropped without close() is collected and closed', async (t) => {
      await withClients(t, store, 1, async (a) => {
        const v8 = require('node:v8');
        const vm = require('node:vm');
        v8.setFlagsFromString('--expose-gc');
        const gc = vm.runInNewContext('gc');
        const threads = () => Number(require('node:fs').readFileSync('/proc/self/status', 'utf8')
          .match(/Threads:\s+(\d+)/)[1]);
        let collected = 0;
        const reg = new FinalizationRegistry(() => collected++);
        const before = threads();
        for (let i = 0; i < 10; i++) reg.register(await a.observe(lockName('dropped')), i);
        assert.ok(threads() >= before + 10, 'each observer has a thread');
        for (let i = 0; i < 50 && (collected < 10 || threads() > before); i++) {
          gc();
          await sleep(50);
        }
        assert.equal(collected, 10, 'the dropped observers were collected');
        assert.ok(threads() <= before, `their threads ended: ${before} before, ${threads()} now`);
      });
    });

    test('bad input: a value over 1024 bytes, bad names and types', async (t) => {
      await withClients(t, store, 1, async (a) => {
        const name = lockName('elect-bad');
        await assert.rejects(a.campaign(name, { value: Buffer.alloc(1025) }),
                             isDlock('DLOCK_EINVAL'));
        await assert.rejects(a.campaign(name, { value: 'é'.repeat(513) }), // 1026 bytes
                             isDlock('DLOCK_EINVAL'));
        assert.equal((await a.leader(name)).held, false, 'a refused campaign leaves no leader');
        const l = await a.campaign(name, { value: Buffer.alloc(1024, 0x61) });
        assert.equal((await a.leader(name)).value.length, 1024);
        await assert.rejects(l.proclaim(Buffer.alloc(1025)), isDlock('DLOCK_EINVAL'));
        assert.equal((await a.leader(name)).value.length, 1024,
                     'a refused proclaim changes nothing');
        await l.resign();
        for (const bad of ['', 'a\0b']) {
          await assert.rejects(a.campaign(bad, { value: 'x' }), isDlock('DLOCK_EINVAL'));
          await assert.rejects(a.leader(bad), isDlock('DLOCK_EINVAL'));
          await assert.rejects(a.observe(bad), isDlock('DLOCK_EINVAL'));
        }
        await assert.rejects(a.campaign('x'.repeat(5000)), isDlock('DLOCK_EINVAL'));
        await assert.rejects(a.campaign(42), TypeError);
        await assert.rejects(a.leader(null), TypeError);
        await assert.rejects(a.campaign(name, { value: 42 }), TypeError);
        await assert.rejects(a.campaign(name, { ttl: 0 }), TypeError);
        await assert.rejects(a.campaign(name, { wait: -1 }), TypeError);
        await assert.rejects(a.campaign(name, null), TypeError);
      });
    });
  });
}
