/**
 * Starting over: `--rerun` is parsed (and a mistyped option refused), and the result table says which results
 * were produced earlier and by which model, suggesting --rerun when the workers now use another one.
 */
import '../src/cli/compose';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseRunArgs } from '../src/cli/args';
import { ConfigError } from '../src/config';
import { printOutcomes } from '../src/runs/result-table';
import { publishedOutcome } from './outcomes';

const offline = { provider: 'offline', model: 'extractive-wink-nlp' };
const haiku = { provider: 'anthropic', model: 'claude-haiku-4-5' };

describe('--rerun', () => {
  it('is an option among the paths, and a mistyped one is refused with the options there are', () => {
    assert.deepEqual(parseRunArgs(['notes/', '--rerun', 'a.md']), { paths: ['notes/', 'a.md'], rerun: true });
    assert.deepEqual(parseRunArgs(['notes/']), { paths: ['notes/'], rerun: false });
    // Its sibling, bulk mode (docs/bulk.md).
    assert.deepEqual(parseRunArgs(['--bulk', 'notes/']), { paths: ['notes/'], rerun: false, bulk: true });
    assert.throws(
      () => parseRunArgs(['--re-run']),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError);
        assert.match(err.message, /unknown option --re-run; the options are --rerun/);
        return true;
      },
    );
  });
});

describe('the result table on results produced earlier', () => {
  it('marks them, names their model, and suggests --rerun when the workers use another model now', () => {
    const lines: string[] = [];
    printOutcomes(
      [
        publishedOutcome('old', { model: offline, doneEarlier: true }),
        publishedOutcome('new', { model: haiku }),
      ],
      (l) => lines.push(l),
      {
        columns: 120,
        configuredModel: haiku,
      },
    );
    const log = lines.join('\n');
    assert.match(lines.find((l) => l.startsWith('old')) ?? '', /published r1, earlier\s+.*\boffline\b/);
    assert.match(
      lines.find((l) => l.startsWith('new')) ?? '',
      /published r1\s+.*\banthropic\/claude-haiku-4-5\b/,
    );
    assert.match(log, /1 result\(s\) were produced earlier, not in this session/);
    assert.match(
      log,
      /Those were made by offline, and the workers are now configured with anthropic\/claude-haiku-4-5: add --rerun/,
    );
  });

  it('does not suggest --rerun when the earlier results came from the configured model', () => {
    const lines: string[] = [];
    printOutcomes([publishedOutcome('old', { model: offline, doneEarlier: true })], (l) => lines.push(l), {
      configuredModel: offline,
    });
    // The table did say the result is an earlier one; it only has no model change to point out.
    assert.match(lines.join('\n'), /1 result\(s\) were produced earlier, not in this session/);
    assert.doesNotMatch(lines.join('\n'), /add --rerun/);
  });
});
