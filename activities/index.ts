/**
 * The step list: every step of the pipeline, in order, the model steps first and publish (the one external effect)
 * last. The composition root hands it to the kit (src/cli/compose.ts), which derives the activities, their
 * registration, the result table's columns, the publication's fields and bulk mode from it; the workflow
 * (workflows/index.ts) calls the steps.
 */
import { publish } from './publish';
import { related } from './related';
import { summarize } from './summarize';
import { tag } from './tag';

export const steps = [summarize, tag, related, publish] as const;
export type Steps = typeof steps;
