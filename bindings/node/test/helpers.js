'use strict';
// Shared by the tests: the stores to run against, unique lock names, and a
// closed loopback port.
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const required = process.env.DLOCK_STORES_REQUIRED === '1';

// [label, environment variable] of every networked store the suite knows.
const NETWORKED = [
  ['redis', 'DLOCK_REDIS_URI'],
  ['postgres', 'DLOCK_POSTGRES_URI'],
  ['mysql', 'DLOCK_MYSQL_URI'],
  ['zookeeper', 'DLOCK_ZK_URI'],
  ['etcd', 'DLOCK_ETCD_URI'],
];

let fileDir = null;
function fileUri() {
  if (!fileDir) {
    fileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-node-'));
    process.on('exit', () => fs.rmSync(fileDir, { recursive: true, force: true }));
  }
  return 'file://' + fileDir;
}

// Every store: {label, uri (null when missing), skip (reason or false)}.
function stores() {
  const list = [{ label: 'file', uri: fileUri(), skip: false, networked: false }];
  for (const [label, env] of NETWORKED) {
    const uri = process.env[env] || null;
    list.push({
      label, uri, env, networked: true,
      // With DLOCK_STORES_REQUIRED=1 a missing store runs, and fails.
      skip: uri || required ? false : `${env} is not set`,
    });
  }
  return list;
}

let seq = 0;
const run = `${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
function lockName(what) {
  return `node-${run}-${what}-${++seq}`;
}

// A loopback port nobody listens on (bound, then closed).
function closedPort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A predicate for assert.rejects: a DlockError of code, with its errno and a
// message.
function isDlock(code) {
  const dlock = require('..');
  const assert = require('node:assert/strict');
  return (e) => {
    assert.ok(e instanceof dlock.DlockError, `a DlockError, not ${e}`);
    assert.ok(e instanceof Error);
    assert.equal(e.code, code);
    assert.equal(e.errno, dlock.codes[code]);
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0, 'the message says something');
    return true;
  };
}

module.exports = { stores, fileUri, lockName, closedPort, sleep, required, isDlock };
