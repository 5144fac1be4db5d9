'use strict';
// What only the file store can show, and what runs in child processes:
// loss of a kept lock, the library override, an idle client letting the
// process exit, a collected client releasing its locks.
const { test: nodeTest } = require('node:test');
// Every case bounded (a wait that never ends fails instead of hanging);
// --test-timeout is not in every node this supports.
const test = (name, ...rest) => {
  const fn = rest.pop();
  return nodeTest(name, { timeout: 60000, ...rest[0] }, fn);
};
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const dlock = require('..');
const { fileUri, lockName, sleep } = require('./helpers');

const pkg = path.join(__dirname, '..');

// Runs a script in a fresh node with the package; returns {status, stdout, stderr, ms}.
function child(script, env = {}, args = []) {
  const t0 = Date.now();
  const r = spawnSync(process.execPath, [...args, '-e', script], {
    cwd: pkg, env: { ...process.env, ...env }, encoding: 'utf8', timeout: 20000,
  });
  return { ...r, ms: Date.now() - t0 };
}

test('keep: a lock whose file is moved away emits lost; release is DLOCK_ELOST', async () => {
  const uri = fileUri();
  const c = await dlock.open(uri);
  try {
    const name = lockName('lost'); // only [A-Za-z0-9-]: the file is NAME.lock
    const file = path.join(new URL(uri).pathname, name + '.lock');
    const l = await c.acquire(name, { keep: true, ttl: 1000 });
    assert.ok(fs.existsSync(file), `${file} exists`);
    const lost = new Promise((resolve) => l.once('lost', resolve));
    await sleep(400);
    assert.equal(l.lost, null, 'not lost while the file is there');
    const t0 = Date.now();
    fs.renameSync(file, file + '.gone');
    const err = await Promise.race([lost, sleep(5000).then(() => null)]);
    assert.ok(err, "'lost' emitted within 5 s");
    assert.ok(Date.now() - t0 < 2000, `lost reported after ${Date.now() - t0} ms`);
    assert.ok(err instanceof dlock.DlockError);
    assert.equal(err.code, 'DLOCK_ELOST');
    assert.equal(err.errno, dlock.codes.DLOCK_ELOST);
    assert.equal(l.lost, 'DLOCK_ELOST');
    await assert.rejects(l.release(), (e) => e.code === 'DLOCK_ELOST');
    assert.equal(l.released, true);
    fs.rmSync(file + '.gone', { force: true });
  } finally {
    await c.close();
  }
});

test('DLOCK_LIBRARY chooses the library loaded', () => {
  const real = fs.realpathSync(dlock.library);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-lib-'));
  try {
    const copy = path.join(dir, 'libdlock-copy.so');
    fs.copyFileSync(real, copy);
    const script = `const d = require('.');
      const maps = require('fs').readFileSync('/proc/self/maps', 'utf8');
      d.open(${JSON.stringify(fileUri())}).then(async (c) => {
        const l = await c.acquire('lib-override', { wait: 'try' });
        await l.release(); await c.close();
        console.log(JSON.stringify({ library: d.library, mapped: maps.includes(${JSON.stringify(copy)}) }));
      });`;
    const r = child(script, { DLOCK_LIBRARY: copy });
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout);
    assert.equal(out.library, copy);
    assert.equal(out.mapped, true, 'the copy is the one mapped');
    // A path that does not exist is an error naming it, not a fallback.
    const bad = child("require('.')", { DLOCK_LIBRARY: path.join(dir, 'nope.so') });
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /cannot load libdlock: .*nope\.so/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('an idle client does not keep the process alive; a waiting acquire does', () => {
  const uri = JSON.stringify(fileUri());
  const idle = child(`require('.').open(${uri}).then(async (c) => {
    const l = await c.acquire('idle', { wait: 'try' }); await l.release();
    console.log('idle'); })`);
  assert.equal(idle.status, 0, idle.stderr);
  assert.equal(idle.stdout.trim(), 'idle');
  assert.ok(idle.ms < 10000, `exited after ${idle.ms} ms`);
  // A wait pending keeps the loop alive until it ends (here: its deadline).
  const waits = child(`const d = require('.');
    (async () => {
      const a = await d.open(${uri}), b = await d.open(${uri});
      await a.acquire('pending');
      b.acquire('pending', { wait: 1500 }).catch((e) => console.log(e.code));
    })()`);
  assert.equal(waits.status, 0, waits.stderr);
  assert.equal(waits.stdout.trim(), 'DLOCK_ETIMEDOUT');
  assert.ok(waits.ms >= 1400, `exited after ${waits.ms} ms, before the wait ended`);
});

test('a collected client is closed on its thread, releasing its locks', () => {
  const uri = JSON.stringify(fileUri());
  const r = child(`const d = require('.');
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
    (async () => {
      await (async () => { const a = await d.open(${uri}); await a.acquire('collected'); })();
      const b = await d.open(${uri});
      await b.acquire('collected', { wait: 'try' }).then(() => console.log('free'), (e) => console.log(e.code));
      for (let i = 0; i < 50; i++) {
        global.gc(); await sleep(100);
        const l = await b.acquire('collected', { wait: 'try' }).catch(() => null);
        if (l) { console.log('released'); await l.release(); break; }
      }
      await b.close();
    })()`, {}, ['--expose-gc']);
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(r.stdout.trim().split('\n'), ['DLOCK_EBUSY', 'released']);
});

test('options are checked', async () => {
  const c = await dlock.open(fileUri());
  try {
    await assert.rejects(c.acquire('x', { ttl: 0 }), TypeError);
    await assert.rejects(c.acquire('x', { ttl: 1.5 }), TypeError);
    await assert.rejects(c.acquire('x', { wait: 'sometimes' }), TypeError);
    await assert.rejects(c.acquire('x', { wait: 'try', deadline: Date.now() }), TypeError);
    await assert.rejects(c.acquire('x', { signal: {} }), TypeError);
    await assert.rejects(c.acquire(7), TypeError);
    await assert.rejects(c.acquire('a\0b', { wait: 'try' }), (e) => e.code === 'DLOCK_EINVAL');
    // Out of range: a TypeError saying what was wrong, never a wrap-around.
    for (const wait of [NaN, -1, Infinity, -Infinity])
      await assert.rejects(c.acquire('x', { wait }), { name: 'TypeError', message: /finite number/ });
    for (const deadline of [new Date(NaN), NaN, Infinity, '2030-01-01'])
      await assert.rejects(c.acquire('x', { deadline }), { name: 'TypeError', message: /deadline/ });
    for (const ttl of [2 ** 32, -1, NaN, Infinity, '1000'])
      await assert.rejects(c.acquire('x', { ttl }), { name: 'TypeError', message: /1 to 4294967295/ });
    const big = await c.acquire(lockName('ttl-max'), { ttl: 2 ** 32 - 1, wait: 'try' });
    await big.renew(2 ** 32 - 1);
    await assert.rejects(big.renew(2 ** 32), { name: 'TypeError', message: /1 to 4294967295/ });
    await big.release();
    // A deadline already past is one attempt, DLOCK_ETIMEDOUT when held.
    const l = await c.acquire('past');
    const d = await dlock.open(fileUri());
    await assert.rejects(d.acquire('past', { deadline: Date.now() - 1000 }),
                         (e) => e.code === 'DLOCK_ETIMEDOUT');
    await d.close();
    await l.release();
  } finally {
    await c.close();
  }
});

test('a wait or deadline past what the clock holds waits forever', async () => {
  const uri = fileUri();
  const a = await dlock.open(uri), b = await dlock.open(uri);
  try {
    // Every built-in backend can cancel a wait: one that stopped
    // declaring it fails here.
    assert.ok(b.caps.cancel, `${b.backend} declares DLOCK_CAP_CANCEL`);
    const name = lockName('far');
    const held = await a.acquire(name);
    // ms * 1e6 past 2^64 ns used to wrap to a deadline already past: an
    // instant DLOCK_ETIMEDOUT. Past 2^63 ns (292 years) is now forever,
    // and below it a deadline; each waits until aborted.
    for (const opts of [{ wait: 1e14 }, { wait: Number.MAX_VALUE }, { wait: 9e12 },
                        { deadline: new Date(8.64e15) }, { deadline: 1e300 }]) {
      const ac = new AbortController();
      const reason = new Error('stop');
      const timer = setTimeout(() => ac.abort(reason), 300);
      const t0 = Date.now();
      await assert.rejects(b.acquire(name, { ...opts, signal: ac.signal }), (e) => e === reason,
                           `${JSON.stringify(opts)}: waits until aborted`);
      clearTimeout(timer);
      const took = Date.now() - t0;
      assert.ok(took >= 250, `${JSON.stringify(opts)}: ended after ${took} ms, before the abort`);
    }
    await held.release();
  } finally {
    await a.close();
    await b.close();
  }
});

test('waits free their cancel flags when they end: descriptors stay flat', async () => {
  const nfd = () => fs.readdirSync('/proc/self/fd').length;
  const c = await dlock.open(fileUri());
  try {
    // Every built-in backend can cancel a wait: one that stopped
    // declaring it fails here.
    assert.ok(c.caps.cancel, `${c.backend} declares DLOCK_CAP_CANCEL`);
    const name = lockName('fds');
    await (await c.acquire(name)).release();
    const before = nfd();
    let most = before;
    // Each wait makes a flag (an eventfd): with a signal, and without one
    // on a backend that can cancel (for close()). They used to stay open
    // until GC: about +120 descriptors per 500 waits.
    for (let i = 0; i < 500; i++) {
      const ac = new AbortController();
      const l = await c.acquire(name, i % 2 ? { signal: ac.signal } : { wait: 10000 });
      await l.release();
      ac.abort(); // after the wait: nothing to cancel, and no crash
      if (i % 25 === 0) most = Math.max(most, nfd());
    }
    most = Math.max(most, nfd());
    assert.ok(most - before < 30, `descriptors went from ${before} to ${most} over 500 waits`);
    // The flag itself: fire() after close() does nothing.
    const native = require('../lib/native');
    const k = new native.Cancel();
    k.close();
    k.fire();
    k.close();
  } finally {
    await c.close();
  }
});

test('Lock and Client are async-disposable', {
  skip: typeof Symbol.asyncDispose !== 'symbol' && 'this node has no Symbol.asyncDispose',
}, async () => {
  const c = await dlock.open(fileUri());
  const l = await c.acquire(lockName('dispose'));
  await l[Symbol.asyncDispose]();
  assert.equal(l.released, true);
  await l[Symbol.asyncDispose](); // released already: nothing
  const l2 = await c.acquire(lockName('dispose'));
  await c[Symbol.asyncDispose]();
  assert.equal(c.closed, true);
  assert.equal(l2.released, true);
});

test('the error table and version are exported', () => {
  assert.equal(dlock.codes.DLOCK_EBUSY, -7);
  assert.equal(dlock.codes.DLOCK_ECANCELED, -22);
  assert.match(dlock.version, /^\d+\.\d+\.\d+/);
});

test('a worker thread ended during a wait: no crash, and its client closes', async () => {
  const { Worker } = require('node:worker_threads');
  const uri = fileUri();
  const a = await dlock.open(uri), b = await dlock.open(uri);
  try {
    // Every built-in backend can cancel a wait: one that stopped
    // declaring it fails here.
    assert.ok(a.caps.cancel, `${a.backend} declares DLOCK_CAP_CANCEL`);
    const name = lockName('worker');
    const held = await a.acquire(name);
    const w = new Worker(`const d = require(${JSON.stringify(pkg)});
      const { parentPort } = require('node:worker_threads');
      d.open(${JSON.stringify(uri)}).then(async (c) => {
        parentPort.postMessage('waiting');
        await c.acquire(${JSON.stringify(name)});
        parentPort.postMessage('granted');
      });`, { eval: true });
    await new Promise((resolve) => w.once('message', resolve));
    await sleep(200);
    await w.terminate();
    await sleep(200);
    // The terminated worker's client is closed (its wait cancelled first,
    // or granted and then released): the lock is free after the release.
    await held.release();
    await sleep(200);
    const l = await b.acquire(name, { wait: 'try' });
    await l.release();
  } finally {
    await a.close();
    await b.close();
  }
});
