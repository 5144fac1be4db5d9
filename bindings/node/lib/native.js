'use strict';
// Loads the addon, then libdlock into it (the addon dlopen()s the library:
// src/dlock_node.cc). Which library, first found wins:
//   1. DLOCK_LIBRARY=/path/to/libdlock.so, when set (no fallback: a wrong
//      path is an error naming it);
//   2. libdlock.so.0 in the directories pkg-config named when the package
//      was built (build/libdlock.json);
//   3. libdlock.so.0 through the system loader (LD_LIBRARY_PATH, ld.so.cache).
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
const addon = require(path.join(root, 'build', 'Release', 'dlock.node'));

function candidates() {
  const forced = process.env.DLOCK_LIBRARY;
  if (forced) return [forced];
  const list = [];
  try {
    const cfg = JSON.parse(fs.readFileSync(path.join(root, 'build', 'libdlock.json'), 'utf8'));
    for (const dir of cfg.libdirs || []) {
      const p = path.join(dir, 'libdlock.so.0');
      if (fs.existsSync(p)) list.push(p);
    }
  } catch {
    // Not built by scripts/install.js: the system loader alone.
  }
  list.push('libdlock.so.0');
  return list;
}

const failures = [];
let library = null;
for (const p of candidates()) {
  try {
    library = addon.load(p);
    break;
  } catch (e) {
    failures.push(e.message);
  }
}
if (library === null)
  throw new Error(failures.join('; ') +
                  (process.env.DLOCK_LIBRARY ? ' (from DLOCK_LIBRARY)' : ''));

module.exports = addon;
module.exports.library = library;
