/**
 * What each agent step of a run did, as the result table and `npm run report` print it: how its loop ended, its
 * turns (those read back from the memo), its tool calls and their outcomes, its tokens and cost.
 */
import { isModelStepFields } from '../contract/plain';
import { formatCost, formatTokens } from '../model/pricing';

/** One line per agent step of `result`: `related: answered in 5 turns (0 memoised), 4 tool calls (...), ...`. */
export function agentLines(result: object | undefined): string[] {
  if (result === undefined) return [];
  const lines: string[] = [];
  for (const [key, value] of Object.entries(result)) {
    if (!isModelStepFields(value) || value.agent === undefined) continue;
    const { outcome, turns, memoisedTurns, toolCalls, continuedAsNew } = value.agent;
    const calls = toolCalls.map((c) => `${c.n} ${c.tool} ${c.outcome}`).join(', ');
    lines.push(
      `${key}: ${outcome} in ${turns} turn(s) (${memoisedTurns} from the memo), ` +
        `${toolCalls.length} tool call(s)${calls === '' ? '' : ` (${calls})`}, ${formatTokens(value.usage)}, ${formatCost(value.estimatedCostUsd)}` +
        (continuedAsNew > 0 ? `, continued as new ${continuedAsNew} time(s)` : ''),
    );
  }
  return lines;
}
