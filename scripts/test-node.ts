/**
 * `npm run test:node -- [22|24|<x.y.z> ...] [test files]`: the tests that depend on the Node underneath
 * (scripts/node-releases.ts) on each tested Node LTS line, or on the lines and files named.
 *
 * Each Node comes from the npm registry (`npm pack node-<platform>-<arch>@<version>`) into `.tools/`, and
 * better-sqlite3, a native module built for one Node ABI, is compiled once per Node with node-gyp against the
 * headers that package ships (`--nodedir`: nothing is fetched from anywhere else). Both are cached in `.tools/`,
 * so a second run installs nothing. The project's own node_modules (built for the Node that runs `npm test`) is
 * never touched: the tests run in a copy of the working tree whose node_modules links every package of this
 * checkout's but better-sqlite3, which gets the build for that Node. The copy is removed when the run ends.
 */
import { execFile, execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { z } from 'zod';
import { runMain, UserFacingError } from '../src/lib/run-main';
import { TOOLS_DIR } from '../src/temporal/binaries';
import { copyRepository } from '../test/scratch';
import { NODE_MATRIX_TESTS, TESTED_NODE_RELEASES } from './node-releases';

const ROOT = path.resolve(__dirname, '..');
const NODE_MODULES = path.join(ROOT, 'node_modules');
/** Compiling SQLite's amalgamation takes minutes on a busy machine; past this the build is stopped. */
const BUILD_TIMEOUT_MS = 30 * 60_000;
const DOWNLOAD_TIMEOUT_MS = 10 * 60_000;

const execFileAsync = promisify(execFile);

/** What `npm pack --json` prints, a package's package.json and a failed command's error: the parts read. */
const PackedSchema = z.array(z.object({ filename: z.string() }));
const PackageSchema = z.object({ version: z.string() });
const OutputSchema = z.object({ stdout: z.string().default(''), stderr: z.string().default('') });

async function run(): Promise<void> {
  const { versions, files } = parseArguments(process.argv.slice(2));
  const results: string[] = [];
  let failed = false;
  for (const version of versions) {
    const started = Date.now();
    const node = await installNode(version);
    const addon = await buildSqliteAddon(node);
    const code = await runTests(node, addon, files);
    const outcome = code === 0 ? 'passed' : `FAILED (exit code ${code})`;
    results.push(`Node ${version}: ${outcome}, ${files.length} file(s), ${minutes(Date.now() - started)}`);
    failed ||= code !== 0;
  }
  console.log(`\nnpm run test:node:\n${results.map((line) => `  ${line}`).join('\n')}`);
  if (failed) process.exit(1);
}

/** Versions (a tested major, or an exact x.y.z) and test files, in any order; none given means all of them. */
function parseArguments(args: string[]): { versions: string[]; files: string[] } {
  const versions: string[] = [];
  const files: string[] = [];
  for (const arg of args) {
    if (/^\d+$/.test(arg)) {
      const pinned = TESTED_NODE_RELEASES[arg];
      if (pinned === undefined) {
        throw new UserFacingError(
          `Node ${arg} is not a tested line (${Object.keys(TESTED_NODE_RELEASES).join(', ')}); ` +
            `name an exact release to try it, e.g. npm run test:node -- ${arg}.0.0`,
        );
      }
      versions.push(pinned);
    } else if (/^\d+\.\d+\.\d+$/.test(arg)) versions.push(arg);
    else if (arg.endsWith('.ts')) {
      if (!fs.existsSync(path.join(ROOT, arg))) throw new UserFacingError(`No test file ${arg}`);
      files.push(arg);
    } else {
      throw new UserFacingError(`"${arg}" is neither a Node version (22, 24.22.3) nor a test file`);
    }
  }
  return {
    versions: versions.length > 0 ? versions : Object.values(TESTED_NODE_RELEASES),
    files: files.length > 0 ? files : [...NODE_MATRIX_TESTS],
  };
}

interface InstalledNode {
  version: string;
  /** The unpacked package: bin/node and include/node. */
  dir: string;
  bin: string;
}

/** Node `version` in `.tools/node-v<version>-<platform>-<arch>`, from the npm registry unless it is there already. */
async function installNode(version: string): Promise<InstalledNode> {
  const dir = path.join(TOOLS_DIR, `node-v${version}-${process.platform}-${process.arch}`);
  const installed = { version, dir, bin: path.join(dir, 'bin', 'node') };
  if (fs.existsSync(installed.bin)) {
    console.log(`Node ${version}: ${path.relative(ROOT, dir)} (installed earlier)`);
    return installed;
  }
  const spec = `node-${process.platform}-${process.arch}@${version}`;
  console.log(`Node ${version}: installing ${spec} from the npm registry into ${path.relative(ROOT, dir)}`);
  fs.mkdirSync(TOOLS_DIR, { recursive: true });
  // Unpacked beside its final place and renamed there whole: an interrupted install leaves no half a Node.
  const staging = fs.mkdtempSync(path.join(TOOLS_DIR, `.node-v${version}-`));
  try {
    const packed = await command('npm', ['pack', spec, '--json', '--pack-destination', staging], {
      timeoutMs: DOWNLOAD_TIMEOUT_MS,
    });
    const [tarball] = PackedSchema.parse(JSON.parse(packed));
    if (tarball === undefined) throw new UserFacingError(`npm pack ${spec} packed nothing`);
    const unpacked = path.join(staging, 'node');
    fs.mkdirSync(unpacked);
    await command('tar', [
      '-xzf',
      path.join(staging, tarball.filename),
      '-C',
      unpacked,
      '--strip-components=1',
    ]);
    const reported = (await command(path.join(unpacked, 'bin', 'node'), ['--version'])).trim();
    if (reported !== `v${version}`)
      throw new UserFacingError(`${spec} holds Node ${reported}, not v${version}`);
    try {
      fs.renameSync(unpacked, dir);
    } catch (err) {
      // Another checkout sharing .tools/ installed the same Node meanwhile.
      if (!fs.existsSync(installed.bin)) throw err;
    }
  } finally {
    fs.rmSync(staging, { recursive: true, force: true });
  }
  return installed;
}

/**
 * better-sqlite3's addon for `node`, compiled once and kept beside that Node: the source is this checkout's
 * better-sqlite3 package (it ships SQLite and its own C++), the headers are the Node package's own.
 */
async function buildSqliteAddon(node: InstalledNode): Promise<string> {
  const source = path.join(NODE_MODULES, 'better-sqlite3');
  const { version } = PackageSchema.parse(
    JSON.parse(fs.readFileSync(path.join(source, 'package.json'), 'utf8')),
  );
  const addon = path.join(node.dir, `better-sqlite3-${version}.node`);
  if (fs.existsSync(addon)) {
    console.log(`better-sqlite3 ${version} for Node ${node.version}: built earlier`);
    return addon;
  }
  console.log(
    `better-sqlite3 ${version} for Node ${node.version}: compiling with node-gyp against ` +
      `${path.relative(ROOT, path.join(node.dir, 'include', 'node'))} (minutes; once per Node)`,
  );
  const staging = fs.mkdtempSync(path.join(os.tmpdir(), `better-sqlite3-node-${node.version}-`));
  try {
    for (const entry of ['package.json', 'binding.gyp', 'deps', 'src', 'lib']) {
      fs.cpSync(path.join(source, entry), path.join(staging, entry), { recursive: true });
    }
    await command(
      node.bin,
      [
        nodeGyp(),
        'rebuild',
        '--release',
        `--nodedir=${node.dir}`,
        // Nothing goes to ~/.cache/node-gyp: with --nodedir there is nothing to download into it anyway.
        `--devdir=${path.join(staging, '.node-gyp')}`,
        '--jobs=2',
      ],
      { cwd: staging, env: environmentFor(node), timeoutMs: BUILD_TIMEOUT_MS },
    );
    const built = path.join(staging, 'build', 'Release', 'better_sqlite3.node');
    // The addon must load in that Node and answer, before it is kept.
    const sqlite = await command(
      node.bin,
      [
        '-e',
        `const Database = require(process.argv[1]);
         const db = new Database(':memory:', { nativeBinding: process.argv[2] });
         console.log(db.prepare('SELECT sqlite_version() AS v').get().v);`,
        source,
        built,
      ],
      { env: environmentFor(node) },
    );
    const partial = `${addon}.${process.pid}.tmp`;
    fs.copyFileSync(built, partial);
    fs.renameSync(partial, addon);
    console.log(`better-sqlite3 ${version} for Node ${node.version}: built (SQLite ${sqlite.trim()})`);
  } finally {
    fs.rmSync(staging, { recursive: true, force: true });
  }
  return addon;
}

/** node-gyp as npm carries it: npm names it to the scripts it runs, else it sits in npm's global folder. */
function nodeGyp(): string {
  const named = process.env.npm_config_node_gyp;
  if (named !== undefined && fs.existsSync(named)) return named;
  const root = execFileSync('npm', ['root', '-g'], { encoding: 'utf8' }).trim();
  const found = path.join(root, 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
  if (!fs.existsSync(found))
    throw new UserFacingError(`node-gyp is not at ${found}; install npm's full package`);
  return found;
}

/**
 * The tests in a copy of the working tree on `node`: its node_modules links this checkout's packages, except
 * better-sqlite3, whose JavaScript is copied (the addon is found next to it) with the addon built for that Node.
 */
async function runTests(node: InstalledNode, addon: string, files: string[]): Promise<number> {
  const tree = fs.mkdtempSync(path.join(os.tmpdir(), `pipeline-node-${node.version}-`));
  try {
    copyRepository(tree);
    const modules = path.join(tree, 'node_modules');
    fs.unlinkSync(modules);
    fs.mkdirSync(modules);
    for (const entry of fs.readdirSync(NODE_MODULES)) {
      if (entry !== 'better-sqlite3')
        fs.symlinkSync(path.join(NODE_MODULES, entry), path.join(modules, entry));
    }
    const sqlite = path.join(modules, 'better-sqlite3');
    for (const entry of ['package.json', 'lib']) {
      fs.cpSync(path.join(NODE_MODULES, 'better-sqlite3', entry), path.join(sqlite, entry), {
        recursive: true,
      });
    }
    fs.mkdirSync(path.join(sqlite, 'build', 'Release'), { recursive: true });
    fs.copyFileSync(addon, path.join(sqlite, 'build', 'Release', 'better_sqlite3.node'));
    // The Temporal binaries (and these Nodes) stay where this checkout keeps them.
    if (fs.existsSync(TOOLS_DIR)) fs.symlinkSync(fs.realpathSync(TOOLS_DIR), path.join(tree, '.tools'));

    console.log(`Node ${node.version}: ${files.join(' ')}`);
    const env = environmentFor(node);
    // TAP, as `npm test` prints on Node 20 (Node 23 and later print the spec reporter by default), so a CI log
    // reads the same on every line: `# pass`, `# fail`, `not ok`.
    env.NODE_OPTIONS = [env.NODE_OPTIONS, '--test-reporter=tap'].filter(Boolean).join(' ');
    const child = spawn(node.bin, ['--import', 'tsx', 'scripts/test.ts', ...files], {
      cwd: tree,
      stdio: 'inherit',
      env,
    });
    // Ctrl-C reaches the runner with this process (one terminal group); a SIGTERM to this process alone is
    // passed on. Either way the runner stops its tests, and the copy is removed once it has.
    const forward = (signal: NodeJS.Signals) => child.kill(signal);
    process.on('SIGINT', forward);
    process.on('SIGTERM', forward);
    try {
      return await new Promise<number>((resolve) =>
        child.once('exit', (code, signal) => resolve(code ?? (signal === null ? 1 : 128))),
      );
    } finally {
      process.off('SIGINT', forward);
      process.off('SIGTERM', forward);
    }
  } finally {
    fs.rmSync(tree, { recursive: true, force: true });
  }
}

/**
 * The environment of a process on `node`: its bin folder first on PATH (so `node` and the `npm` the tests start
 * run on it), without what npm set for this script (the Node that runs npm, npm's own config, its PATH entries).
 */
function environmentFor(node: InstalledNode): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.toLowerCase().startsWith('npm_') && name !== 'NODE' && name !== 'INIT_CWD') env[name] = value;
  }
  const searchPath = (process.env.PATH ?? '')
    .split(path.delimiter)
    .filter(
      (dir) => dir !== '' && !dir.includes(`node_modules${path.sep}.bin`) && !dir.endsWith('node-gyp-bin'),
    );
  env.PATH = [path.dirname(node.bin), ...searchPath].join(path.delimiter);
  return env;
}

/** Runs a command to its end and returns its stdout; a failure says what it printed. */
async function command(
  file: string,
  args: string[],
  {
    cwd = ROOT,
    env = process.env,
    timeoutMs = 60_000,
  }: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<string> {
  try {
    const { stdout } = await execFileAsync(file, args, {
      cwd,
      env,
      timeout: timeoutMs,
      killSignal: 'SIGKILL',
      maxBuffer: 64 * 1024 * 1024,
      encoding: 'utf8',
    });
    return stdout;
  } catch (err) {
    const output = OutputSchema.safeParse(err);
    const { stdout, stderr } = output.success ? output.data : { stdout: '', stderr: '' };
    const tail = `${stdout}\n${stderr}`.trim().split('\n').slice(-30).join('\n');
    throw new UserFacingError(
      `${path.basename(file)} ${args.slice(0, 2).join(' ')} failed (${err instanceof Error ? err.message.split('\n')[0] : String(err)}):\n${tail}`,
    );
  }
}

function minutes(ms: number): string {
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, '0')}s`;
}

runMain(run);
