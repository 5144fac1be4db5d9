'use strict';
// dlock for Node.js: a promise API over libdlock. Every blocking call runs
// on the client's own worker thread (src/dlock_node.cc); this file turns
// options into the C ones, errors into DlockError, and keeps the Lock
// objects. See README.md for units, threading, cancel and loss.
const { EventEmitter } = require('node:events');
const native = require('./native');

const codes = Object.freeze({ ...native.codes });
const WAIT_TRY = 0, WAIT_DEADLINE = 1, WAIT_FOREVER = 2;
const TTL_MAX = 0xffffffff;
const LIMIT_MAX = 65535;

class DlockError extends Error {
  constructor(code, errno, message) {
    super(message);
    this.name = 'DlockError';
    this.code = code;
    this.errno = errno;
  }
}

// Native rejections are plain {errno, code, detail, holds} objects.
function toError(e) {
  if (e && typeof e === 'object' && !(e instanceof Error) && typeof e.errno === 'number')
    return new DlockError(e.code, e.errno, e.detail || native.strerror(e.errno));
  return e;
}

function invalid(message) {
  return new DlockError('DLOCK_EINVAL', codes.DLOCK_EINVAL, message);
}

// A bad option's value, for its error.
function show(v) {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') return `'${v}'`;
  if (v instanceof Date) return 'an invalid Date';
  return v === null ? 'null' : `a value of type ${typeof v}`;
}

function checkTtl(ttl, what) {
  if (!Number.isInteger(ttl) || ttl <= 0 || ttl > TTL_MAX)
    throw new TypeError(`${what} must be an integer number of milliseconds, 1 to ${TTL_MAX}, ` +
                        `not ${show(ttl)}`);
  return ttl;
}

// A semaphore's limit: undefined (a read-write lock) or 1 to LIMIT_MAX.
function limitOf(opts) {
  const { limit } = opts;
  if (limit === undefined) return 0;
  if (!Number.isInteger(limit) || limit < 1 || limit > LIMIT_MAX)
    throw new TypeError(`limit must be an integer from 1 to ${LIMIT_MAX}, not ${show(limit)}`);
  return limit;
}

// -> [ttl, wait mode, deadline in ms from now]. A deadline too far for
// libdlock's clock (past 2^63 ns, 292 years) is a wait forever: the addon
// turns it into one.
function waitOf(opts) {
  const ttl = opts.ttl === undefined ? 30000 : checkTtl(opts.ttl, 'ttl');
  const { wait, deadline } = opts;
  if (deadline !== undefined) {
    if (wait !== undefined && wait !== 'deadline')
      throw new TypeError("deadline cannot be combined with wait (other than 'deadline')");
    const at = deadline instanceof Date ? deadline.getTime() : deadline;
    if (typeof at !== 'number' || !Number.isFinite(at))
      throw new TypeError('deadline must be a valid Date or a finite number of milliseconds ' +
                          `since the epoch, not ${show(deadline)}`);
    return [ttl, WAIT_DEADLINE, at - Date.now()];
  }
  if (wait === undefined || wait === 'forever') return [ttl, WAIT_FOREVER, 0];
  if (wait === 'try') return [ttl, WAIT_TRY, 0];
  if (typeof wait === 'number' && wait >= 0 && Number.isFinite(wait))
    return [ttl, WAIT_DEADLINE, wait];
  throw new TypeError("wait must be 'try', 'forever' or a finite number of milliseconds >= 0, " +
                      `not ${show(wait)}`);
}

class Lock extends EventEmitter {
  #client;
  #id;
  #name;
  #token;
  #lost = null;
  #released = false;
  #shared;
  #limit;

  constructor(client, id, name, token, shared, limit) {
    super();
    this.#client = client;
    this.#id = id;
    this.#name = name;
    this.#token = token;
    this.#shared = shared;
    this.#limit = limit;
  }

  /** Fencing token (bigint): above every earlier grant of the name. */
  get token() { return this.#token; }
  get name() { return this.#name; }
  /** 'exclusive' or 'shared', as acquired. */
  get mode() { return this.#shared ? 'shared' : 'exclusive'; }
  /** The semaphore's limit; 0 for a read-write lock. */
  get limit() { return this.#limit; }
  get client() { return this.#client; }
  /** null, or 'DLOCK_ELOST' / 'DLOCK_EEXPIRED' once a kept lock is lost. */
  get lost() { return this.#lost; }
  get released() { return this.#released; }

  async release() { return this.#client._release(this, this.#id); }

  async renew(ttl) {
    checkTtl(ttl, 'ttl');
    return this.#client._renew(this, this.#id, ttl);
  }

  _setReleased() { this.#released = true; }

  _setLost(code, err) {
    if (this.#lost !== null) return;
    this.#lost = code;
    this.emit('lost', err);
  }
}

class Client {
  #native;
  #locks = new Map(); // id -> Lock: held until release() or close()
  #waits = new Set(); // cancel flags of the acquires in flight
  #closed = false;

  constructor(nativeClient, info) {
    this.#native = nativeClient;
    this.backend = info.backend;
    this.caps = Object.freeze(info.caps);
  }

  get closed() { return this.#closed; }

  async acquire(name, opts = {}) {
    if (typeof name !== 'string')
      throw new TypeError('name must be a string');
    if (opts === null || typeof opts !== 'object')
      throw new TypeError('options must be an object');
    const [ttl, mode, rel] = waitOf(opts);
    const limit = limitOf(opts);
    const shared = !!opts.shared;
    const signal = opts.signal;
    if (signal !== undefined && !(signal instanceof AbortSignal))
      throw new TypeError('signal must be an AbortSignal');
    if (signal?.aborted) throw signal.reason;
    if (this.#closed) throw invalid('the client is closed');
    // A wait gets a cancel flag when it has a signal, and also on a
    // backend that can cancel, so that close() can end it.
    let cancel = null;
    const onAbort = () => cancel.fire();
    if (signal || (mode !== WAIT_TRY && this.caps.cancel)) {
      cancel = new native.Cancel();
      this.#waits.add(cancel);
      signal?.addEventListener('abort', onAbort, { once: true });
    }
    let r;
    try {
      r = await this.#native.acquire(name, ttl, mode, rel, !!opts.keep, !!opts.reentrant,
                                     cancel, shared, limit);
    } catch (e) {
      if (e && e.errno === codes.DLOCK_ECANCELED) {
        if (signal?.aborted) throw signal.reason;
        if (this.#closed) throw new DlockError('DLOCK_ECANCELED', e.errno,
                                               'the client was closed during the wait');
      }
      throw toError(e);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      if (cancel) {
        this.#waits.delete(cancel);
        // Its eventfd now, not at GC: a loop of waits would pile them up.
        // A fire() after this does nothing.
        cancel.close();
      }
    }
    let lock = this.#locks.get(r.id);
    if (!lock) {
      lock = new Lock(this, r.id, name, r.token, shared, limit);
      this.#locks.set(r.id, lock);
    }
    return lock;
  }

  /** Every holder of name, in grant order, without taking it: objects
   * with the fields the store filled (mode, limit, token, owner, leaseMs). */
  async inspectHolders(name) {
    if (typeof name !== 'string')
      throw new TypeError('name must be a string');
    if (this.#closed) throw invalid('the client is closed');
    try {
      return await this.#native.inspectHolders(name);
    } catch (e) {
      throw toError(e);
    }
  }

  async withLock(name, opts, fn) {
    if (typeof opts === 'function') [opts, fn] = [{}, opts];
    if (typeof fn !== 'function') throw new TypeError('withLock needs a function');
    const lock = await this.acquire(name, opts);
    let result;
    try {
      result = await fn(lock);
    } catch (e) {
      if (!lock.released) await lock.release().catch(() => {});
      throw e;
    }
    // A release that fails (DLOCK_ELOST: the lease ran out during fn) is
    // reported: what fn did may not have been protected.
    if (!lock.released) await lock.release();
    return result;
  }

  async _release(lock, id) {
    if (lock.released) throw invalid('the lock was already released');
    let holds;
    try {
      holds = await this.#native.release(id);
    } catch (e) {
      if (e && e.holds === 0) this.#forget(id, lock);
      const err = toError(e);
      if (err.errno === codes.DLOCK_ELOST) lock._setLost('DLOCK_ELOST', err);
      throw err;
    }
    if (holds === 0) this.#forget(id, lock);
  }

  async _renew(lock, id, ttl) {
    if (lock.released) throw invalid('the lock was already released');
    try {
      await this.#native.renew(id, ttl);
    } catch (e) {
      const err = toError(e);
      if (err.errno === codes.DLOCK_ELOST) lock._setLost('DLOCK_ELOST', err);
      throw err;
    }
  }

  #forget(id, lock) {
    this.#locks.delete(id);
    lock._setReleased();
  }

  _lost(id, errno, code, detail) {
    const lock = this.#locks.get(id);
    if (lock) lock._setLost(code, new DlockError(code, errno, detail || native.strerror(errno)));
  }

  /** Releases every lock still held and ends the client's thread. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    // Waits queued before the close would hold it back (forever, for
    // wait: 'forever'): they end with DLOCK_ECANCELED.
    for (const cancel of this.#waits) cancel.fire();
    try {
      await this.#native.close();
    } finally {
      for (const [id, lock] of this.#locks) this.#forget(id, lock);
    }
  }

}

// `await using` (TypeScript 5.2+, Node versions that parse it): a Lock is
// released, a Client closed. Only where the runtime has the symbol.
if (typeof Symbol.asyncDispose === 'symbol') {
  Object.defineProperty(Lock.prototype, Symbol.asyncDispose, {
    async value() { if (!this.released) await this.release(); },
    writable: true, configurable: true,
  });
  Object.defineProperty(Client.prototype, Symbol.asyncDispose, {
    async value() { await this.close(); },
    writable: true, configurable: true,
  });
}

async function open(uri) {
  if (typeof uri !== 'string') throw new TypeError('uri must be a string');
  // The native client keeps its dispatch function alive: it must not keep
  // the Client (which would then never be collected), hence the WeakRef.
  let weak = null;
  const n = new native.Client((id, errno, code, detail) => {
    weak?.deref()?._lost(id, errno, code, detail);
  });
  let info;
  try {
    info = await n.open(uri);
  } catch (e) {
    throw toError(e);
  }
  const client = new Client(n, info);
  weak = new WeakRef(client);
  return client;
}

module.exports = {
  open,
  Client,
  Lock,
  DlockError,
  codes,
  version: native.version(),
  library: native.library,
};
