/**
 * freeLoopbackPort: the ports it hands out for servers other processes start (dev servers, their UIs, metrics)
 * lie below the kernel's range for outgoing connections, are free when handed out, and differ between callers.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import { closeServer, FREE_PORT_RANGE, freeLoopbackPort, listenOnLoopback } from '../src/lib/loopback';

describe('freeLoopbackPort', () => {
  it('hands out free ports below the range the kernel takes outgoing connections from, none twice', async () => {
    const ports = await Promise.all(Array.from({ length: 40 }, () => freeLoopbackPort()));
    assert.equal(new Set(ports).size, ports.length, `a port handed out twice: ${ports.join(', ')}`);
    const ephemeral = fs.existsSync('/proc/sys/net/ipv4/ip_local_port_range')
      ? Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0])
      : 32_768;
    for (const port of ports) {
      assert.ok(port >= FREE_PORT_RANGE.from && port < FREE_PORT_RANGE.to, `port ${port} outside the range`);
      assert.ok(port < ephemeral, `port ${port} is in the kernel's range for outgoing connections`);
    }
    // Each one binds.
    for (const port of ports.slice(0, 5)) {
      const server = http.createServer();
      await listenOnLoopback(server, 'check', port);
      await closeServer(server);
    }
  });
});
