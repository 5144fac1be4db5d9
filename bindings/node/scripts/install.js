'use strict';
// npm's install step: builds the addon with node-gyp and records where
// pkg-config says libdlock is, for lib/native.js to load at run time.
//
// Node's headers: the ones installed beside this node (Debian's nodejs
// has them in /usr/include/node) are used when present, so nothing is
// downloaded; otherwise node-gyp does what it always does. The
// npm_config_nodedir setting, when given, wins.
const { spawnSync, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');

// `npm install /path/to/bindings/node` links the folder and runs this
// script there without installing the folder's own dependencies (npm
// leaves a linked folder to be managed in place): install them from the
// lock file first, as `npm ci` would, without dev tools or scripts.
function ensureDeps() {
  try {
    require.resolve('node-addon-api');
    require.resolve('node-gyp/bin/node-gyp.js');
    return;
  } catch {
    // below
  }
  const env = {};
  for (const [k, v] of Object.entries(process.env))
    if (!k.toLowerCase().startsWith('npm_')) env[k] = v; // not the outer install's settings
  const npm = process.env.npm_execpath && /\.js$/.test(process.env.npm_execpath)
    ? [process.execPath, process.env.npm_execpath] : ['npm'];
  const r = spawnSync(npm[0], [...npm.slice(1), 'ci', '--omit=dev', '--ignore-scripts',
                               '--no-audit', '--no-fund'], { cwd: root, stdio: 'inherit', env });
  if (r.status !== 0) {
    console.error('dlock: cannot install node-addon-api and node-gyp in ' + root);
    process.exit(1);
  }
}
ensureDeps();

function pkgConfig(args) {
  try {
    return execFileSync('pkg-config', [...args, 'dlock'], { encoding: 'utf8' }).trim();
  } catch (e) {
    console.error('dlock: pkg-config cannot find libdlock (dlock.pc); install libdlock or set ' +
                  'PKG_CONFIG_PATH to the directory holding dlock.pc (or a meson build\'s ' +
                  'meson-uninstalled directory)');
    process.exit(1);
  }
}

const libdirs = [];
for (const flag of pkgConfig(['--libs-only-L']).split(/\s+/))
  if (flag.startsWith('-L')) libdirs.push(flag.slice(2));
const libdir = pkgConfig(['--variable=libdir']);
if (libdir) libdirs.push(libdir);

const args = [require.resolve('node-gyp/bin/node-gyp.js'), 'rebuild'];
const prefix = path.join(path.dirname(process.execPath), '..');
if (!process.env.npm_config_nodedir &&
    fs.existsSync(path.join(prefix, 'include', 'node', 'node_api.h')) &&
    fs.existsSync(path.join(prefix, 'include', 'node', 'common.gypi')))
  args.push('--nodedir=' + fs.realpathSync(prefix));
const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
if (r.status !== 0) process.exit(r.status === null ? 1 : r.status);

fs.writeFileSync(path.join(root, 'build', 'libdlock.json'),
                 JSON.stringify({ libdirs, version: pkgConfig(['--modversion']) }, null, 2) + '\n');
