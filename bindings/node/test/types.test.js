'use strict';
// index.d.ts checked by the TypeScript compiler (a devDependency: skipped
// when the package was installed without it).
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

let tsc = null;
try {
  tsc = require.resolve('typescript/bin/tsc');
} catch {
  // npm install --omit=dev
}

test('index.d.ts compiles with a usage example (tsc --strict)', { skip: !tsc && 'typescript is not installed' }, () => {
  const root = path.join(__dirname, '..');
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--target', 'es2022',
    '--lib', 'es2022,esnext.disposable', '--module', 'commonjs', '--types', 'node',
    '--skipLibCheck', 'false', path.join(root, 'index.d.ts'), path.join(__dirname, 'types', 'usage.ts')],
  { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
