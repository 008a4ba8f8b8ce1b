/**
 * The one logger of the worker and the entry points: pino, JSON lines when the output is not a terminal (a
 * container, a pipe, a file), coloured single lines when it is. The Temporal SDK logs through it too (activity
 * `log`, workflow `log` via the SDK's sinks, the SDK's own lines and the native core's), so every line about a run
 * carries its workflow and run IDs.
 */
import pino from 'pino';
import pretty from 'pino-pretty';
import type { LogLevel as SdkLogLevel, LogMetadata, Logger as SdkLoggerInterface } from '@temporalio/common';
import type { LogLevel } from '../config';

export type Logger = pino.Logger;

export interface LoggerOptions {
  level?: LogLevel;
  /** Where the lines go; stderr by default, so a command's own output (tables, reports) keeps stdout. */
  stream?: NodeJS.WritableStream & { isTTY?: boolean };
  /** Coloured one-line records for a person; by default exactly when `stream` is a terminal. */
  pretty?: boolean;
}

/** Fields a terminal reader does not need on every line; the JSON lines keep them. */
const PRETTY_IGNORE = 'pid,hostname,sdkComponent,namespace,taskQueue,workflowType,activityType,target';

/** A logger: JSON lines, or pretty lines on a terminal. */
export function createLogger({
  level = 'info',
  stream = process.stderr,
  pretty: human = stream.isTTY === true,
}: LoggerOptions = {}): Logger {
  const options: pino.LoggerOptions = {
    level,
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
  };
  if (human) {
    return pino(
      options,
      pretty({
        destination: stream,
        colorize: stream.isTTY === true,
        singleLine: true,
        translateTime: 'SYS:HH:MM:ss.l',
        ignore: PRETTY_IGNORE,
        sync: true,
      }),
    );
  }
  // Synchronous on stderr: the last lines before process.exit (a refused start, a crash) are not lost.
  return pino(options, stream === process.stderr ? pino.destination({ fd: 2, sync: true }) : stream);
}

let processLogger: Logger | undefined;

/** This process's logger: the one installRuntime made, or an `info` logger on stderr until then. */
export function logger(): Logger {
  processLogger ??= createLogger();
  return processLogger;
}

/** Makes `l` this process's logger (installRuntime does, once the configuration gave LOG_LEVEL). */
export function setLogger(l: Logger): void {
  processLogger = l;
}

/** True when failures should carry their stack traces: at LOG_LEVEL=debug and below. */
export function logsStacks(l: Logger): boolean {
  return l.isLevelEnabled('debug');
}

/** A failure as log fields: what and why on one line, the stack and the cause chain only when `stacks`. */
export function errorFields(err: unknown, stacks: boolean): Record<string, unknown> {
  if (!(err instanceof Error)) return { error: String(err) };
  const type = 'type' in err && typeof err.type === 'string' ? err.type : err.name;
  return {
    error: err.message,
    errorType: type,
    ...(stacks
      ? { stack: err.stack, ...(err.cause !== undefined ? { cause: errorFields(err.cause, true) } : {}) }
      : {}),
  };
}

const PINO_LEVEL: Record<SdkLogLevel, LogLevel> = {
  TRACE: 'trace',
  DEBUG: 'debug',
  INFO: 'info',
  WARN: 'warn',
  ERROR: 'error',
};

/** Metadata the SDK gives that a line shows differently (runId, error fields) or not at all (noise). */
const REPLACED_FIELDS = new Set(['taskToken', 'isLocal', 'spanContexts', 'workflowRunId', 'error']);

/**
 * The SDK's Logger over a pino logger, for `Runtime.install`. The SDK hands each line its context as metadata:
 * an activity's gives `workflowRunId`, a workflow's `runId`; both become `runId`. The task token (a long base64
 * string) is dropped, and an `error` becomes its message unless stacks are wanted (see errorFields).
 */
export class SdkLogger implements SdkLoggerInterface {
  constructor(private readonly target: Logger) {}

  log(level: SdkLogLevel, message: string, meta: LogMetadata = {}): void {
    let pinoLevel = PINO_LEVEL[level];
    const sdkOwn = meta.sdkComponent === 'worker' || meta.sdkComponent === 'core';
    // The SDK's own progress (bundling, worker states, polling) is for debugging: quiet by default.
    if (sdkOwn && pinoLevel === 'info') pinoLevel = 'debug';
    // The worker's record of a failed attempt carries the whole stack; the attempt reporter
    // (src/telemetry/attempts.ts) logs the one line a person needs instead, so the SDK's goes to debug.
    if (sdkOwn && message === 'Activity failed' && pinoLevel === 'warn') pinoLevel = 'debug';
    if (!this.target.isLevelEnabled(pinoLevel)) return;
    const fields = Object.fromEntries(Object.entries(meta).filter(([key]) => !REPLACED_FIELDS.has(key)));
    if (meta.workflowRunId !== undefined) fields.runId = meta.workflowRunId;
    if (meta.error !== undefined) Object.assign(fields, errorFields(meta.error, logsStacks(this.target)));
    this.target[pinoLevel](fields, message);
  }

  trace(message: string, meta?: LogMetadata): void {
    this.log('TRACE', message, meta);
  }
  debug(message: string, meta?: LogMetadata): void {
    this.log('DEBUG', message, meta);
  }
  info(message: string, meta?: LogMetadata): void {
    this.log('INFO', message, meta);
  }
  warn(message: string, meta?: LogMetadata): void {
    this.log('WARN', message, meta);
  }
  error(message: string, meta?: LogMetadata): void {
    this.log('ERROR', message, meta);
  }
}
