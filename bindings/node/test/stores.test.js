'use strict';
// The C conformance cases that apply to a binding, against file:// and
// every store whose URI is in the environment (DLOCK_REDIS_URI, ...): a
// missing store is skipped, or fails under DLOCK_STORES_REQUIRED=1.
const { describe, test: nodeTest } = require('node:test');
// Every case bounded (a wait that never ends fails instead of hanging);
// --test-timeout is not in every node this supports.
const test = (name, ...rest) => {
  const fn = rest.pop();
  return nodeTest(name, { timeout: 60000, ...rest[0] }, fn);
};
const assert = require('node:assert/strict');
const dlock = require('..');
const { stores, lockName, closedPort, sleep, isDlock } = require('./helpers');

// Opens n clients, runs fn(...clients), closes them whatever happens.
async function withClients(uri, n, fn) {
  const clients = [];
  try {
    for (let i = 0; i < n; i++) clients.push(await dlock.open(uri));
    return await fn(...clients);
  } finally {
    for (const c of clients) await c.close();
  }
}

for (const store of stores()) {
  describe(store.label, { skip: store.skip }, () => {
    const { uri } = store;

    test('the store URI is set', () => {
      assert.ok(uri, `${store.env} must be set (DLOCK_STORES_REQUIRED=1)`);
    });

    test('try: a held lock is DLOCK_EBUSY with code, errno and message', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('try');
        const l = await a.acquire(name, { wait: 'try' });
        assert.equal(typeof l.token, 'bigint');
        assert.equal(l.name, name);
        assert.equal(l.lost, null);
        await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        await l.renew(10000);
        await assert.rejects(l.renew(0), TypeError);
        await l.release();
        assert.equal(l.released, true);
        await assert.rejects(l.release(), isDlock('DLOCK_EINVAL'));
        await assert.rejects(l.renew(1000), isDlock('DLOCK_EINVAL'));
        const again = await b.acquire(name, { wait: 'try' });
        await again.release();
      });
    });

    test('wait (ms) and deadline (Date) end in DLOCK_ETIMEDOUT on time', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('deadline');
        const l = await a.acquire(name);
        let t0 = Date.now();
        await assert.rejects(b.acquire(name, { wait: 300 }), isDlock('DLOCK_ETIMEDOUT'));
        let took = Date.now() - t0;
        assert.ok(took >= 250 && took < 5000, `wait: 300 took ${took} ms`);
        t0 = Date.now();
        await assert.rejects(b.acquire(name, { deadline: new Date(Date.now() + 300) }),
                             isDlock('DLOCK_ETIMEDOUT'));
        took = Date.now() - t0;
        assert.ok(took >= 250 && took < 5000, `deadline +300 ms took ${took} ms`);
        await l.release();
      });
    });

    test('a waiting acquire is granted on release; the event loop keeps ticking', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('wait');
        const l = await a.acquire(name);
        let ticks = 0;
        const timer = setInterval(() => ticks++, 10);
        try {
          const waiting = b.acquire(name, { wait: 'forever' });
          await sleep(500);
          assert.ok(ticks >= 20, `the loop ticked ${ticks} times in 500 ms of waiting`);
          await l.release();
          const got = await waiting;
          assert.ok(got.token > l.token, 'the next grant has a higher token');
          await got.release();
        } finally {
          clearInterval(timer);
        }
      });
    });

    test('fencing tokens strictly increase across clients', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('fencing');
        let last = -1n;
        for (let i = 0; i < 6; i++) {
          const l = await (i % 2 ? a : b).acquire(name, { wait: 5000 });
          assert.ok(l.token > last, `token ${l.token} > ${last}`);
          last = l.token;
          await l.release();
        }
      });
    });

    test('FIFO handoff: waiters are served in the order they came', async (t) => {
      await withClients(uri, 4, async (a, ...waiters) => {
        if (!a.caps.fifo) {
          t.skip(`${a.backend} does not serve waiters in order (no DLOCK_CAP_FIFO)`);
          return;
        }
        const name = lockName('fifo');
        const held = await a.acquire(name);
        const order = [];
        const tokens = [];
        const done = [];
        for (const [i, w] of waiters.entries()) {
          done.push(w.acquire(name, { wait: 10000 }).then(async (l) => {
            order.push(i);
            tokens.push(l.token);
            await sleep(20);
            await l.release();
          }));
          await sleep(300); // queued before the next one comes
        }
        await held.release();
        await Promise.all(done);
        assert.deepEqual(order, [0, 1, 2]);
        assert.ok(tokens[0] > held.token && tokens[1] > tokens[0] && tokens[2] > tokens[1],
                  `tokens increase: ${held.token} ${tokens}`);
      });
    });

    test('an already aborted signal rejects at once with its reason', async () => {
      await withClients(uri, 1, async (a) => {
        const reason = new Error('not wanted');
        const t0 = Date.now();
        await assert.rejects(a.acquire(lockName('aborted'), { signal: AbortSignal.abort(reason) }),
                             (e) => e === reason);
        assert.ok(Date.now() - t0 < 100);
      });
    });

    test('abort during a wait rejects with AbortError; the next waiter is still served',
         async () => {
      await withClients(uri, 3, async (a, b, c) => {
        const name = lockName('abort');
        const held = await a.acquire(name);
        const ac = new AbortController();
        // Every built-in backend can cancel a wait: one that stopped
        // declaring it fails here (its cancellable waits would be refused).
        assert.ok(b.caps.cancel, `${b.backend} declares DLOCK_CAP_CANCEL`);
        const cancelled = b.acquire(name, { signal: ac.signal });
        await sleep(200);
        const next = c.acquire(name, { wait: 10000 });
        await sleep(200);
        const t0 = Date.now();
        ac.abort();
        await assert.rejects(cancelled, (e) => e === ac.signal.reason && e.name === 'AbortError');
        const took = Date.now() - t0;
        assert.ok(took < 3000, `the wait ended ${took} ms after abort`);
        await held.release();
        const l = await next;
        assert.ok(l.token > held.token);
        await l.release();
        // b still works after its cancelled wait.
        const again = await b.acquire(name, { wait: 'try' });
        await again.release();
      });
    });

    test('withLock releases when the function throws, and returns its value', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('withlock');
        await assert.rejects(a.withLock(name, { ttl: 10000 }, async (l) => {
          assert.equal(l.name, name);
          await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
          throw new Error('boom');
        }), /boom/);
        const v = await a.withLock(name, async () => 42);
        assert.equal(v, 42);
        const l = await b.acquire(name, { wait: 'try' });
        await l.release();
      });
    });

    test('close() with locks held releases them', async () => {
      await withClients(uri, 1, async (b) => {
        const a = await dlock.open(uri);
        const n1 = lockName('close'), n2 = lockName('close');
        const l1 = await a.acquire(n1), l2 = await a.acquire(n2, { keep: true, ttl: 5000 });
        await a.close();
        assert.equal(a.closed, true);
        assert.equal(l1.released, true);
        assert.equal(l2.released, true);
        await assert.rejects(l1.release(), isDlock('DLOCK_EINVAL'));
        await assert.rejects(a.acquire(n1, { wait: 'try' }), isDlock('DLOCK_EINVAL'));
        for (const n of [n1, n2]) await (await b.acquire(n, { wait: 'try' })).release();
        await a.close(); // twice is harmless
      });
    });

    test('close() ends a wait of the same client (DLOCK_ECANCELED)', async () => {
      await withClients(uri, 1, async (a) => {
        const b = await dlock.open(uri);
        if (!b.caps.cancel) await b.close();
        assert.ok(b.caps.cancel, `${b.backend} declares DLOCK_CAP_CANCEL`);
        const name = lockName('close-wait');
        const held = await a.acquire(name);
        const waiting = assert.rejects(b.acquire(name, { wait: 'forever' }),
                                       isDlock('DLOCK_ECANCELED'));
        await sleep(200);
        const t0 = Date.now();
        await b.close();
        assert.ok(Date.now() - t0 < 3000, `close() took ${Date.now() - t0} ms`);
        await waiting;
        await held.release();
      });
    });

    test('keep: the keeper holds a lock past its TTL', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('keep');
        const l = await a.acquire(name, { keep: true, ttl: 1000 });
        let lost = null;
        l.on('lost', (e) => { lost = e; });
        await sleep(2500);
        assert.equal(lost, null);
        assert.equal(l.lost, null);
        await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        await l.release();
      });
    });

    test('keep: a loss as the lock is granted is still reported (ttl 1 ms)', async (t) => {
      await withClients(uri, 1, async (a) => {
        if (!a.caps.lease) {
          t.skip(`${a.backend} has no lease to run out`);
          return;
        }
        // A 1 ms lease is over about when the acquire returns: the keeper
        // reports some losses before the lock is filed under its id, which
        // used to drop them (about 1 in 100 on redis, 1 in 5 on etcd and
        // MySQL, on loopback). Every one must arrive, once.
        let granted = 0;
        for (let i = 0; i < 200; i++) {
          let l;
          try {
            l = await a.acquire(lockName('lost-early'), { keep: true, ttl: 1 });
          } catch (e) {
            // The lease may end before the grant reaches the client: nothing
            // held (PostgreSQL: DLOCK_ECONNECT, the session ended).
            assert.ok(e instanceof dlock.DlockError, String(e));
            continue;
          }
          granted++;
          let emitted = 0;
          l.on('lost', () => emitted++);
          for (let k = 0; k < 400 && !emitted; k++) await sleep(5);
          assert.equal(emitted, 1, `grant ${i}: 'lost' emitted ${emitted} times in 2 s`);
          assert.ok(['DLOCK_ELOST', 'DLOCK_EEXPIRED'].includes(l.lost), `lost: ${l.lost}`);
          await l.release().catch(() => {});
          assert.equal(l.released, true);
          assert.equal(emitted, 1);
        }
        assert.ok(granted >= 100, `${granted} of 200 granted`);
      });
    });

    test('a reentrant acquire returns the same Lock', async () => {
      await withClients(uri, 2, async (a, b) => {
        const name = lockName('reentrant');
        const l1 = await a.acquire(name, { reentrant: true });
        const l2 = await a.acquire(name, { reentrant: true });
        assert.equal(l1, l2);
        await l1.release();
        assert.equal(l1.released, false);
        await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        await l1.release();
        assert.equal(l1.released, true);
        await (await b.acquire(name, { wait: 'try' })).release();
      });
    });

    test('inspectHolders: none when free, the holder when held', async () => {
      await withClients(uri, 1, async (a) => {
        const name = lockName('holders');
        assert.deepEqual(await a.inspectHolders(name), []);
        const l = await a.acquire(name, { wait: 'try' });
        assert.equal(l.mode, 'exclusive');
        assert.equal(l.limit, 0);
        const hs = await a.inspectHolders(name);
        assert.equal(hs.length, 1);
        if ('token' in hs[0]) assert.equal(hs[0].token, l.token);
        if ('mode' in hs[0]) assert.deepEqual([hs[0].mode, hs[0].limit], ['exclusive', 0]);
        await l.release();
        assert.deepEqual(await a.inspectHolders(name), []);
        await assert.rejects(a.inspectHolders(''), isDlock('DLOCK_EINVAL'));
      });
    });

    test('shared: readers together, a writer out, DLOCK_EMODE at once (or DLOCK_ENOTSUP)',
      async () => {
        await withClients(uri, 3, async (a, b, w) => {
          const name = lockName('shared');
          if (!a.caps.shared) {
            await assert.rejects(a.acquire(name, { wait: 'try', shared: true }),
                                 isDlock('DLOCK_ENOTSUP'));
            return;
          }
          const r1 = await a.acquire(name, { wait: 'try', shared: true });
          const r2 = await b.acquire(name, { wait: 10000, shared: true });
          assert.deepEqual([r1.mode, r2.mode, r1.limit], ['shared', 'shared', 0]);
          assert.ok(r2.token > r1.token);
          await assert.rejects(w.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
          const t0 = Date.now();
          // DLOCK_ENOTSUP where the store has no semaphores; at once either way
          await assert.rejects(w.acquire(name, { wait: 5000, limit: 2 }),
                               isDlock(a.caps.semaphore ? 'DLOCK_EMODE' : 'DLOCK_ENOTSUP'));
          assert.ok(Date.now() - t0 < 2500, 'a semaphore on a read-write name is refused at once');
          const hs = await w.inspectHolders(name);
          assert.deepEqual(hs.map((h) => h.mode), ['shared', 'shared']);
          assert.deepEqual(hs.map((h) => h.token), [r1.token, r2.token]);
          await r1.release();
          await r2.release();
          const x = await w.acquire(name, { wait: 'try' });
          assert.ok(x.token > r2.token, 'an exclusive token is above every earlier shared one');
          await x.release();
        });
      });

    test('limit: at most N permits, DLOCK_EMODE for another kind (or DLOCK_ENOTSUP)',
      async () => {
        await withClients(uri, 3, async (a, b, c) => {
          const name = lockName('semaphore');
          if (!a.caps.semaphore) {
            await assert.rejects(a.acquire(name, { wait: 'try', limit: 2 }),
                                 isDlock('DLOCK_ENOTSUP'));
            return;
          }
          const p1 = await a.acquire(name, { wait: 'try', limit: 2 });
          const p2 = await b.acquire(name, { wait: 'try', limit: 2 });
          assert.deepEqual([p1.mode, p1.limit, p2.limit], ['exclusive', 2, 2]);
          await assert.rejects(c.acquire(name, { wait: 'try', limit: 2 }), isDlock('DLOCK_EBUSY'));
          for (const other of [{ limit: 3 }, {}, { shared: true }])
            await assert.rejects(c.acquire(name, { wait: 5000, ...other }), isDlock('DLOCK_EMODE'));
          const hs = await c.inspectHolders(name);
          assert.deepEqual(hs.map((h) => h.limit), [2, 2]);
          assert.deepEqual(hs.map((h) => h.token), [p1.token, p2.token]);
          const waiting = c.acquire(name, { wait: 10000, limit: 2 });
          await p1.release();
          const p3 = await waiting;
          assert.ok(p3.token > p2.token);
          assert.equal(p2.released, false);
          await p3.release();
          await p2.release();
        });
      });

    if (store.networked) {
      test('a closed loopback port is DLOCK_ECONNECT', async () => {
        const u = new URL(uri);
        u.hostname = '127.0.0.1';
        u.port = String(await closedPort());
        await assert.rejects(dlock.open(u.toString()), isDlock('DLOCK_ECONNECT'));
      });
    }
  });
}

test('bad limits are a TypeError, shared with a limit DLOCK_EINVAL; nothing taken', async () => {
  await withClients(stores()[0].uri, 1, async (a) => {
    const name = lockName('badlimit');
    for (const limit of [0, -1, 65536, 2 ** 32, 1.5, '3', null, NaN, Infinity])
      await assert.rejects(a.acquire(name, { wait: 'try', limit }), TypeError, `limit ${limit}`);
    await assert.rejects(a.acquire(name, { wait: 'try', shared: true, limit: 3 }),
                         isDlock('DLOCK_EINVAL'));
    assert.equal(dlock.codes.DLOCK_EMODE, -23);
    assert.deepEqual(await a.inspectHolders(name), []);
  });
});

test('bad URIs: DLOCK_EBADURI, DLOCK_ESCHEME, and no crash', async () => {
  await assert.rejects(dlock.open('redis://127.0.0.1:notaport/0'), (e) =>
    e instanceof dlock.DlockError && e.code === 'DLOCK_EBADURI' && e.errno === -2);
  await assert.rejects(dlock.open('nosuch://x'), (e) => e.code === 'DLOCK_ESCHEME');
  await assert.rejects(dlock.open(''), (e) => e instanceof dlock.DlockError);
  await assert.rejects(dlock.open(42), TypeError);
});
