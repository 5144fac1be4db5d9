'use strict';
// rediss:// through the package (the library's TLS transport: the whole
// conformance suite runs over it in C): a lock over TLS taken, refused to
// a second client and handed on with a higher token; a server certificate
// that the given CA did not sign refused as DLOCK_EAUTH, saying why.
const { describe, test } = require('node:test');
const assert = require('node:assert/strict');
const dlock = require('..');
const { lockName, isDlock } = require('./helpers');

const uri = process.env.DLOCK_REDIS_TLS_URI || null;
const required = process.env.DLOCK_STORES_REQUIRED === '1';

describe('redis-tls', { skip: uri || required ? false : 'DLOCK_REDIS_TLS_URI is not set' }, () => {
  test('the TLS store URI is set', () => {
    assert.ok(uri, 'DLOCK_REDIS_TLS_URI must be set (DLOCK_STORES_REQUIRED=1)');
  });

  test('a lock over TLS: refused to another client, handed on with a higher token',
    { timeout: 30000 }, async () => {
      const a = await dlock.open(uri);
      const b = await dlock.open(uri);
      try {
        const name = lockName('tls');
        const first = await a.acquire(name, { wait: 'try' });
        await assert.rejects(b.acquire(name, { wait: 'try' }), isDlock('DLOCK_EBUSY'));
        await first.release();
        const second = await b.acquire(name, { wait: 5000 });
        assert.ok(second.token > first.token);
        await second.release();
      } finally {
        await a.close();
        await b.close();
      }
    });

  test('a certificate the CA did not sign: DLOCK_EAUTH, saying why', { timeout: 30000 },
    async () => {
      const bad = uri.replace('/ca.crt', '/other-ca.crt');
      assert.notEqual(bad, uri, 'the TLS URI names its CA file ca.crt');
      await assert.rejects(dlock.open(bad), (e) =>
        isDlock('DLOCK_EAUTH')(e) && /certificate/.test(e.message));
    });
});
