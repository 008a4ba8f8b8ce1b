/**
 * A network namespace of a test's own, joined to this one by a veth pair: a "host" whose only way out is that link,
 * so a test can cut it off from one server (through a tcpLink on the host side) and not from the others. Made with
 * `ip netns` (root), removed after the file's tests.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { Defer } from './scratch';

export interface Namespace {
  name: string;
  /** This side's address on the link: what the namespace reaches the tests' servers (their tcpLinks) at. */
  hostAddress: string;
  /** The command to run a process inside it, before the process's own. */
  exec: string[];
}

export function networkNamespace(defer: Defer): Namespace {
  const id = randomBytes(3).toString('hex');
  const name = `pipe-${id}`;
  // A /30 of its own in the link-local range, from the id: two namespaces of one run do not collide.
  const third = parseInt(id.slice(0, 2), 16);
  const fourth = (parseInt(id.slice(2, 4), 16) % 63) * 4;
  const [hostAddress, nsAddress] = [`169.254.${third}.${fourth + 1}`, `169.254.${third}.${fourth + 2}`];
  const [hostEnd, nsEnd] = [`vh-${id}`, `vn-${id}`];
  const ip = (...args: string[]): void => void execFileSync('ip', args, { stdio: 'pipe' });
  ip('netns', 'add', name);
  defer(() => {
    try {
      ip('netns', 'del', name);
    } catch {
      // Gone already.
    }
  });
  ip('link', 'add', hostEnd, 'type', 'veth', 'peer', 'name', nsEnd);
  ip('link', 'set', nsEnd, 'netns', name);
  ip('addr', 'add', `${hostAddress}/30`, 'dev', hostEnd);
  ip('link', 'set', hostEnd, 'up');
  ip('netns', 'exec', name, 'ip', 'addr', 'add', `${nsAddress}/30`, 'dev', nsEnd);
  ip('netns', 'exec', name, 'ip', 'link', 'set', nsEnd, 'up');
  ip('netns', 'exec', name, 'ip', 'link', 'set', 'lo', 'up');
  return { name, hostAddress, exec: ['ip', 'netns', 'exec', name] };
}
