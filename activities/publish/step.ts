/** The publish step in the step list (activities/steps.ts): the one external effect, last. */
import type { PublishInput, PublishResult } from '../../src/contract';
import { defineStep } from '../step-definition';

export const publishStep = defineStep<PublishInput, PublishResult>()({
  name: 'publish',
  model: false,
  resultKey: 'publication',
});
