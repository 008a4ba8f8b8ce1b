/**
 * `npm run bench`: the pipeline's speed against the alternatives, measured in one run on one machine, so the
 * ratios hold even where the absolute figures do not. Runs the Rust-book corpus (../shared/corpus/rust-book) when
 * it is there, else the samples, through the same offline model:
 *
 * - a plain loop (no durability) and a SQLite checkpoint loop (synchronous FULL and NORMAL);
 * - this pipeline on a file-backed dev server: with the server's defaults, then tuned (src/temporal/tuning.ts),
 *   at 1, 4, 16 and 64 documents at once through the batch workflow, and one document at a time started eagerly;
 * - per-step overhead, history size, peak memory, worker cold start (bundle or source), and the time from a
 *   worker's SIGKILL to its step running again on another worker;
 * - the project's own cost per step (the eager row less the yardstick, Temporal alone), and where it goes: the
 *   activities' timed phases, workflow-task and activity time from the histories, the codec and a span alone;
 * - the throughput ceiling, the higher of the modelled one (Temporal alone's best, plus the model's CPU a document
 *   over the cores) and the measured one (the busy yardstick's best), and how near the pipeline's best comes to it.
 *
 * Prints a markdown table, writes bench/results.json and bench/results.svg. A benchmark, not a test: it asserts
 * nothing and takes a few minutes. `--quick` runs 20 documents and skips the slow rows.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import * as prettier from 'prettier';
import { runMain } from '../src/lib/run-main';
import { call, checkpointLoop, model, plainLoop } from './lib/loops';
import { microCosts } from './lib/breakdown';
import { table, chart } from './lib/output';
import { pipelineRuns } from './lib/pipeline';
import { round } from './lib/rows';
import type { Doc, Row } from './lib/rows';
import { summarizeRequest } from '../test/requests';

const ROOT = path.resolve(__dirname, '..');
const QUICK = process.argv.includes('--quick');
const CORPUS = path.resolve(ROOT, '..', 'shared', 'corpus', 'rust-book');

function loadCorpus(): { where: string; docs: Doc[] } {
  const dir = fs.existsSync(CORPUS) ? CORPUS : path.join(ROOT, 'samples');
  const docs = fs
    .readdirSync(dir)
    .filter((f) => /\.(md|markdown|txt)$/.test(f) && !/^README|^LICENSE/i.test(f))
    .sort()
    .map((name) => ({ name, text: fs.readFileSync(path.join(dir, name), 'utf8') }))
    .filter((d) => d.text.trim() !== '');
  return { where: path.relative(ROOT, dir), docs: QUICK ? docs.slice(0, 20) : docs };
}

async function run(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const { where, docs } = loadCorpus();
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pipeline-bench-'));
  console.log(
    `Corpus: ${where}, ${docs.length} documents. Machine: ${os.cpus().length} cores, Node ${process.version}.`,
  );
  let peakRss = 0;
  const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 100);
  try {
    // Warm the model (wink-nlp loads lazily), so the first loop does not pay for it.
    await model.ask(summarizeRequest(3), docs[0]?.text ?? 'Warm up.', call('warm'));
    const plain = await plainLoop(docs, root);
    const full = await checkpointLoop(docs, root, 'FULL');
    const normal = await checkpointLoop(docs, root, 'NORMAL');

    const rows: Row[] = [plain.row, full, normal];
    const runOn = async (
      label: string,
      tuned: boolean,
      concurrencies: number[],
      eager: boolean,
      extras: boolean,
    ) => {
      const result = await pipelineRuns(root, docs, plain.workMs, {
        label,
        tuned,
        concurrencies,
        eager,
        extras,
      });
      for (const r of result.rows)
        console.log(`  ${r.path}, ${r.concurrency} at once: ${r.docsPerSecond} docs/s`);
      rows.push(...result.rows);
      return result;
    };
    const untuned = await runOn('default', false, [1], false, false);
    const tuned = await runOn('tuned', true, QUICK ? [1, 16] : [1, 4, 16, 64], true, !QUICK);

    const checkpointMs = full.msPerDocP50;
    const eagerRow = rows.find((r) => r.path.startsWith('pipeline, one document at a time'));
    const aloneAtOne = rows.find((r) => r.path.startsWith('Temporal alone') && r.concurrency === 1);
    const ownCostNoOp =
      eagerRow?.perStepOverheadMsP50 !== undefined && aloneAtOne?.perStepOverheadMsP50 !== undefined
        ? round(eagerRow.perStepOverheadMsP50 - aloneAtOne.perStepOverheadMsP50)
        : undefined;
    const ownCost = tuned.paired?.ownCostMsPerStepP50;
    const aloneBest = Math.max(
      ...rows
        .filter((r) => r.path.startsWith('Temporal alone: the same three steps doing nothing'))
        .map((r) => r.docsPerSecond),
    );
    // The ceiling measured: the busy yardstick (the model's CPU time on a thread, nothing of the project's) at its
    // best concurrency.
    const busyRates = rows
      .filter((r) => r.path.includes('busy') && r.concurrency > 1)
      .map((r) => r.docsPerSecond);
    const busyBest = busyRates.length > 0 ? Math.max(...busyRates) : undefined;
    // The ceiling modelled: Temporal alone's best rate, with the model's CPU a document spread over every core on
    // top. It takes Temporal alone to use both cores to the full; where it leaves some idle, the busy yardstick
    // gets more, so the ceiling held against is the higher of the two.
    const modelled = round(1 / (1 / aloneBest + plain.msPerDoc / 1000 / os.cpus().length));
    const ceiling = Math.max(modelled, busyBest ?? 0);
    const sample = await model.ask(summarizeRequest(3), docs[0]?.text ?? 'Sample.', call('sample'));
    const micro = await microCosts({ summary: sample.value, usage: sample.usage, model: model.info });
    console.log('');
    console.log(table(rows, checkpointMs));
    const pipelineRows = rows.filter((r) => r.path.startsWith('pipeline'));
    const tunedAtOne = rows.find((r) => r.path.includes('batch workflow, tuned') && r.concurrency === 1);
    const best = Math.max(...pipelineRows.map((r) => r.docsPerSecond));
    const temporalAlone = rows.filter((r) =>
      r.path.startsWith('Temporal alone: the same three steps doing nothing'),
    );
    const results = {
      measuredAt: new Date().toISOString(),
      machine: { cores: os.cpus().length, memoryGiB: round(os.totalmem() / 2 ** 30), node: process.version },
      corpus: { where, documents: docs.length },
      perStepOverheadMsP50: tunedAtOne?.perStepOverheadMsP50,
      perStepOverheadMsP95: tunedAtOne?.perStepOverheadMsP95,
      // The project's own cost: each document through the pipeline less the same document through Temporal alone
      // with the model's scoring for steps, one at a time, in pairs (bench/lib/paired.ts); p50 over documents.
      ownCostMsPerStepP50: ownCost,
      ownCostMsPerStepP95: tuned.paired?.ownCostMsPerStepP95,
      ownCostMsPerStepP50ByPass: tuned.paired?.ownCostMsPerStepP50ByPass,
      // What carrying the pipeline's one `patched()` costs a run (Temporal's marker and search-attribute upsert: the
      // no-op yardstick with and without it, after the passes), and the own cost beside it.
      patchMsPerStepP50: tuned.paired?.patchMsPerStepP50,
      ownCostMsPerStepP50BesidePatch: tuned.paired?.ownCostMsPerStepP50BesidePatch,
      // One durable commit where the steps make it, beside the Temporal server's writes (the memo answer's phase,
      // p50: a SQLite commit and an fdatasync of its log): the unit the own cost is held against.
      durableCommitMsP50InSitu: tuned.breakdown?.phases['memo answer']?.p50Ms,
      // The same in each pass of the pairs, beside ownCostMsPerStepP50ByPass.
      durableCommitMsP50ByPass: tuned.paired?.durableCommitMsP50ByPass,
      // Each pass's p50 run, pipeline and busy yardstick: which of the two moves from pass to pass.
      pairedMsPerDocP50ByPass: tuned.paired?.msPerDocP50ByPass,
      // The same, read as the eager row's per-step overhead less the no-op yardstick's, each from its own run: it
      // also counts the workflow task that the pipeline's steps ending apart cost Temporal.
      ownCostMsPerStepP50AgainstNoOpYardstick: ownCostNoOp,
      // Where it goes, one document at a time: see bench/speed.md.
      ownCostBreakdown: {
        // Each pair's histories cut into the pipeline's segments: where in a run the difference lies.
        historySplitMsPerDoc: tuned.paired?.historySplitMsPerDoc,
        ...tuned.breakdown,
        cpuMsPerDocByBucket: tuned.cpuMsPerDoc,
        microCosts: micro,
      },
      // Against the checkpoint table's own cost per step (synchronous=FULL, as durable as the pipeline).
      perStepOverheadRatioToCheckpointLoop:
        tunedAtOne?.perStepOverheadMsP50 !== undefined && full.perStepOverheadMsP50 !== undefined
          ? Math.round(tunedAtOne.perStepOverheadMsP50 / full.perStepOverheadMsP50)
          : undefined,
      // The floor: the same shape of workflow with activities that do nothing, on the same server.
      perStepMsP50TemporalAlone: temporalAlone.find((r) => r.concurrency === 1)?.perStepOverheadMsP50,
      // The ceiling: the most documents a second Temporal alone gets through here.
      docsPerSecondBestTemporalAlone: Math.max(...temporalAlone.map((r) => r.docsPerSecond)),
      docsPerSecondBest: best,
      // What the pipeline is held against: the higher of the modelled and the measured ceiling, and the pipeline's
      // best rate over it, each the median over rounds in which the pipeline and every part of the ceiling ran back
      // to back (bench/lib/rounds.ts); from the table's rows where no rounds ran.
      throughputCeilingDocsPerSecond: tuned.throughput?.ceilingP50 ?? ceiling,
      throughputCeilingFraction: tuned.throughput?.fractionP50 ?? round(best / ceiling, 2),
      throughputRounds: tuned.throughput?.rounds,
      // From the table's rows, each a run of its own. Modelled: 1 / (1 / docsPerSecondBestTemporalAlone + model
      // work a document / cores), the model's work from the plain loop (its mean time a document). Measured: the
      // busy yardstick's best rate.
      throughputCeilingModelledDocsPerSecond: modelled,
      throughputCeilingModelledFraction: round(best / modelled, 2),
      throughputCeilingMeasuredDocsPerSecond: busyBest,
      throughputCeilingMeasuredFraction: busyBest !== undefined ? round(best / busyBest, 2) : undefined,
      modelMsPerDoc: round(plain.msPerDoc, 2),
      modelProcessCpuMsPerDoc: round(plain.cpuMsPerDoc, 2),
      checkpointLoopMsPerDoc: {
        full: full.msPerDocP50,
        normal: normal.msPerDocP50,
        plain: plain.row.msPerDocP50,
      },
      workerPeakMiB: round(peakRss / 2 ** 20),
      workflowBundleKiB: tuned.bundleKiB,
      serverPeakMiB: { default: untuned.serverPeakMiB, tuned: tuned.serverPeakMiB },
      workerColdStartMs: tuned.coldStart,
      killToResumeMs: tuned.killToResumeMs,
      rows,
    };
    console.log('');
    console.log(
      `Per-step overhead p50 (tuned, 1 at a time): ${results.perStepOverheadMsP50} ms; best ${best} docs/s; ` +
        `worker peak ${results.workerPeakMiB} MiB; server peak ${tuned.serverPeakMiB ?? '?'} MiB (default ` +
        `${untuned.serverPeakMiB ?? '?'} MiB); workflow bundle ${tuned.bundleKiB} KiB.`,
    );
    console.log(
      `Own cost per step p50 (each document, pipeline less the busy yardstick, in pairs): ${ownCost ?? '?'} ms ` +
        `(p95 ${tuned.paired?.ownCostMsPerStepP95 ?? '?'}; by pass ${tuned.paired?.ownCostMsPerStepP50ByPass.join(', ') ?? '?'}; ` +
        `the patch ${tuned.paired?.patchMsPerStepP50 ?? '?'} ms of it, the rest beside it ` +
        `${tuned.paired?.ownCostMsPerStepP50BesidePatch ?? '?'}; a durable commit in situ ` +
        `${results.durableCommitMsP50InSitu ?? '?'} ms, by pass ` +
        `${tuned.paired?.durableCommitMsP50ByPass.join(', ') ?? '?'}; ` +
        `the eager row less the no-op yardstick: ` +
        `${ownCostNoOp ?? '?'} ms). Throughput ceiling in the table's rows ${ceiling} docs/s, the higher of ` +
        `the modelled ${modelled} (Temporal alone ${aloneBest}, model ${round(plain.msPerDoc)} ms a document) ` +
        `and the measured ${busyBest ?? '?'} (the busy yardstick's best): the best row reaches ` +
        `${Math.round((100 * best) / ceiling)}% of it.`,
    );
    if (tuned.throughput !== undefined) {
      const byRound = tuned.throughput.rounds
        .map((r) => `${r.pipeline} of ${r.ceiling} (${r.fraction})`)
        .join(', ');
      console.log(
        `Throughput in rounds, the pipeline's best of the ceiling: ${byRound}; median fraction ` +
          `${tuned.throughput.fractionP50}.`,
      );
    }
    console.log(`Breakdown: ${JSON.stringify(results.ownCostBreakdown, null, 1)}`);
    if (tuned.coldStart !== undefined) {
      console.log(
        `Worker cold start: ${tuned.coldStart.fromSourceMs} ms bundling from source, ${tuned.coldStart.fromBundleMs} ms from the prebuilt bundle.`,
      );
    }
    if (tuned.killToResumeMs !== undefined) {
      console.log(
        `SIGKILL of a worker mid-step to the step running on another worker: ${tuned.killToResumeMs} ms.`,
      );
    }
    // In the repository's own format (npm run lint checks it): prettier lays short arrays on one line.
    const resultsFile = path.join(__dirname, 'results.json');
    const json = await prettier.format(JSON.stringify(results, null, 2), {
      ...(await prettier.resolveConfig(resultsFile)),
      filepath: resultsFile,
    });
    fs.writeFileSync(resultsFile, json);
    fs.writeFileSync(path.join(__dirname, 'results.svg'), chart(rows, ceiling));
    console.log('Wrote bench/results.json and bench/results.svg.');
  } finally {
    clearInterval(sampler);
    fs.rmSync(root, { recursive: true, force: true });
  }
}

runMain(run);
