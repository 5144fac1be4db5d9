'use strict';
// A TAP reporter for meson: one flat line per test ("ok 3 - redis > try:
// ..."), suites folded into the names, details as # comments. Node's own
// tap reporter nests subtests in indented blocks that meson's parser
// rejects. Usage: node --test --test-reporter=./test/tap-flat.js FILES
const path = require('node:path');

module.exports = async function* flatTap(source) {
  yield 'TAP version 13\n';
  const names = [];
  let n = 0;
  for await (const { type, data } of source) {
    if (type === 'test:start') {
      names[data.nesting] = data.name;
      names.length = data.nesting + 1;
      continue;
    }
    if (type === 'test:diagnostic') {
      yield `# ${data.message}\n`;
      continue;
    }
    if (type !== 'test:pass' && type !== 'test:fail') continue;
    const failed = type === 'test:fail';
    const details = data.details || {};
    // Suites and files are only reported when they themselves failed or
    // were skipped (their tests are reported one by one).
    const group = details.type === 'suite' || (data.nesting === 0 && data.file &&
                                               path.resolve(data.name) === data.file);
    if (group && !data.skip && !(failed && details.error &&
        details.error.failureType !== 'subtestsFailed'))
      continue;
    const full = names.slice(0, data.nesting).concat(data.name)
      .filter((s) => !s.endsWith('.js'))
      .join(' > ').replace(/#/g, '\\#');
    let line = `${failed ? 'not ok' : 'ok'} ${++n} - ${full || data.name}`;
    if (data.skip !== undefined && data.skip !== false)
      line += ` # SKIP ${typeof data.skip === 'string' ? data.skip : ''}`;
    else if (data.todo !== undefined && data.todo !== false)
      line += ` # TODO ${typeof data.todo === 'string' ? data.todo : ''}`;
    yield line + '\n';
    if (failed && details.error) {
      const e = details.error.cause || details.error;
      for (const l of String((e && e.stack) || e).split('\n')) yield `# ${l}\n`;
    }
  }
  yield `1..${n}\n`;
};
