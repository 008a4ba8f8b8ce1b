/**
 * Output sized to the terminal: the result table's rows fit the terminal's width, a long title is cut once (with
 * an ellipsis), and the columns line up.
 */
import '../src/cli/compose';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { cut, titleWidth } from '../src/runs/columns';
import { printOutcomes } from '../src/runs/result-table';
import { publishedOutcome } from './outcomes';

const usage = { inputTokens: 1200, outputTokens: 85 };

describe('the result table', () => {
  const long = 'A Very Long Title About Durable Execution, Checkpoints and Idempotency Keys in Practice';
  const outcomes = [
    publishedOutcome(long, {
      tags: ['durable execution', 'checkpoint', 'idempotency key', 'workflow history', 'activity retry'],
      usage,
    }),
    publishedOutcome('Short', { tags: ['one'], usage }),
  ];

  for (const columns of [80, 120]) {
    it(`fits ${columns} columns, cutting the title once`, () => {
      const lines: string[] = [];
      printOutcomes(outcomes, (l) => lines.push(l), { columns });
      const table = lines.slice(lines.indexOf('Results') + 1, lines.indexOf('Results') + 7);
      for (const line of table) assert.ok(line.length <= columns, `${line.length} > ${columns}: ${line}`);
      const row = table.find((l) => l.startsWith('A Very Long'));
      assert.ok(row !== undefined, table.join('\n'));
      // Cut once, where the table cuts it: the cell is a prefix of the title and an ellipsis.
      const cell = row.slice(0, row.indexOf('  '));
      assert.ok(cell.endsWith('…') && long.startsWith(cell.slice(0, -1)) && cell.length >= 16, cell);
      assert.equal(cut(long, titleWidth(columns, columns)).length, 16);
      // Aligned: the status column starts at the same place on the header and every row.
      const header = table[0] ?? '';
      const statusAt = header.indexOf('Status');
      for (const line of [table[2], table[4]]) assert.match(line?.slice(statusAt) ?? '', /^published r1/);
    });
  }
});
