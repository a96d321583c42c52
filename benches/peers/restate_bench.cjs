// Restate as a peer for `saga-harness bench --peers`.
//
// Starts the Restate server (the binary its npm package ships) on
// 127.0.0.1 with a fresh base directory, serves a service whose handler
// runs N trivial `ctx.run` steps, registers it, then times one invocation of
// BENCH_SEQUENTIAL_STEPS steps and 8 concurrent invocations of
// BENCH_CONCURRENT_STEPS steps. Protocol: one JSON line when ready, then one
// JSON line of figures per "round" read on standard input; "quit" ends.
"use strict";

// The SDK uses Promise.withResolvers, which Node 20 lacks.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

// The SDK logs to standard output, which carries this script's answers.
process.env.RESTATE_LOGGING = process.env.RESTATE_LOGGING || "ERROR";

const path = require("node:path");
const fs = require("node:fs");
const net = require("node:net");
const http2 = require("node:http2");
const readline = require("node:readline");
const { spawn } = require("node:child_process");

const say = (value) => process.stdout.write(JSON.stringify(value) + "\n");
const modules = process.env.RESTATE_BENCH_MODULES;
const baseDir = process.env.RESTATE_BENCH_DATA || path.join(require("node:os").tmpdir(), `restate-bench-${process.pid}`);
const SEQUENTIAL = Number(process.env.BENCH_SEQUENTIAL_STEPS || 1000);
const CONCURRENT = Number(process.env.BENCH_CONCURRENT_STEPS || 250);
const INVOCATIONS = 8;

let restate;
try {
  restate = require(path.join(modules, "@restatedev", "restate-sdk"));
} catch (e) {
  say({ error: `cannot load the Restate SDK: ${e.message}` });
  process.exit(0);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(url, what) {
  for (let i = 0; i < 300; i++) {
    try {
      const res = await fetch(url);
      if (res.ok) return;
    } catch (_) {}
    await sleep(100);
  }
  throw new Error(`${what} did not come up at ${url}`);
}

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[rank - 1];
}

const bench = restate.service({
  name: "bench",
  handlers: {
    steps: async (ctx, n) => {
      const latencies = [];
      for (let i = 0; i < n; i++) {
        const at = performance.now();
        await ctx.run(`step-${i}`, () => i + 1);
        latencies.push(performance.now() - at);
      }
      return latencies;
    },
  },
});

let server;
let child;

async function start() {
  const [ingress, admin, node, service] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
  fs.rmSync(baseDir, { recursive: true, force: true });
  fs.mkdirSync(baseDir, { recursive: true });
  const binary = path.join(modules, "@restatedev", "restate-server-linux-x64", "bin", "restate-server");
  child = spawn(binary, ["--no-logo", "--base-dir", baseDir, "--listen-mode", "tcp"], {
    env: {
      ...process.env,
      RESTATE_INGRESS__BIND_ADDRESS: `127.0.0.1:${ingress}`,
      RESTATE_ADMIN__BIND_ADDRESS: `127.0.0.1:${admin}`,
      RESTATE_BIND_ADDRESS: `127.0.0.1:${node}`,
      RESTATE_ADVERTISED_ADDRESS: `http://127.0.0.1:${node}`,
      RESTATE_LOG_FILTER: "warn",
    },
    // Its shutdown and update-check complaints would bury the table.
    stdio: ["ignore", "ignore", "ignore"],
  });
  child.on("exit", (code) => {
    if (!stopping) say({ error: `the Restate server exited with ${code}` });
  });
  server = http2.createServer(restate.endpoint().bind(bench).http2Handler());
  await new Promise((resolve) => server.listen(service, "127.0.0.1", resolve));
  await waitFor(`http://127.0.0.1:${admin}/health`, "the Restate admin API");
  await waitFor(`http://127.0.0.1:${ingress}/restate/health`, "the Restate ingress");
  const registered = await fetch(`http://127.0.0.1:${admin}/deployments`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ uri: `http://127.0.0.1:${service}` }),
  });
  if (!registered.ok) throw new Error(`registering the service: ${registered.status} ${await registered.text()}`);
  return `http://127.0.0.1:${ingress}/bench/steps`;
}

async function invoke(url, n) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(n),
  });
  if (!res.ok) throw new Error(`invocation answered ${res.status} ${await res.text()}`);
  return res.json();
}

async function round(url) {
  let at = performance.now();
  const latencies = await invoke(url, SEQUENTIAL);
  const wall = performance.now() - at;
  at = performance.now();
  await Promise.all(Array.from({ length: INVOCATIONS }, () => invoke(url, CONCURRENT)));
  const concurrentWall = performance.now() - at;
  return {
    "c1.p50_ms": percentile(latencies, 50),
    "c1.p99_ms": percentile(latencies, 99),
    "c1.mean_ms": wall / SEQUENTIAL,
    "c1.per_s": (SEQUENTIAL * 1000) / wall,
    "c8.per_s": (INVOCATIONS * CONCURRENT * 1000) / concurrentWall,
  };
}

let stopping = false;
async function stop() {
  stopping = true;
  if (server) server.close();
  if (child && child.exitCode === null) {
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await Promise.race([exited, sleep(10000)]);
  }
  fs.rmSync(baseDir, { recursive: true, force: true });
}

(async () => {
  let url;
  try {
    url = await start();
    await invoke(url, 10); // warm up
  } catch (e) {
    say({ error: `Restate did not start: ${e.message}` });
    await stop();
    process.exit(0);
  }
  say({ ready: "restate" });
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const command = line.trim();
    if (command === "quit") break;
    if (command === "round") {
      try {
        say(await round(url));
      } catch (e) {
        say({ error: `Restate round failed: ${e.message}` });
      }
    }
  }
  await stop();
  process.exit(0);
})();
