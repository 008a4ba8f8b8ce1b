/**
 * The kit's worker-side API for the face: what a step's folder (activities/<step>/) and the step list use to
 * define steps. The workflow-side API, safe in the sandbox, is src/workflow/index.ts; the composition root that
 * hands the step list to the kit's worker and client is src/cli/compose.ts.
 */
export { defineModelStep, definePublishStep, modelName } from './steps/define';
export type {
  DocumentStepInput,
  ModelStepDefinition,
  ModelStepResultOf,
  PublishStepDefinition,
  StepActivities,
  StepAsk,
  StepFields,
  StepList,
  StepResults,
} from './steps/define';
export { jsonAnswer, textAnswer } from './model/types';
export type { AgentMessage, AgentReply, AgentToolCall } from './model/types';
/** Agent steps: a loop of model turns and tool calls (docs/agent.md). */
export { agentTool, ANSWER_TOOL, defineAgentStep } from './steps/agent';
export type {
  AgentStepDefinition,
  AgentStepResult,
  AgentTool,
  AgentToolContext,
  CorpusDocument,
} from './steps/agent';
/** The offline model's analysis of a text (sentences, tokens with lemma and part of speech), for offline answers. */
export { analyse, HEADING_WEIGHT } from './model/offline-nlp';
export type { Sentence, Token } from './model/offline-nlp';
