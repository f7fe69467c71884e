// A real agent against a running areal node: an agent written with the
// OpenAI Agents SDK (@openai/agents; its tool declared the SDK's way, with
// zod), over the official openai client, runs multi-turn episodes and ends
// them with rewards; the run trains on them. Then the trained trajectories
// (trajectories.jsonl) are checked against what the client saw: exactly the
// token ids the endpoint returned on the tokens with loss mask 1, the
// versions per token, and the staleness bound per episode.
//
//   node agents_sdk_test.mjs AREAL_BINARY CONFIG WORK_DIR
import { spawn } from 'node:child_process';
import { readFileSync, existsSync, mkdirSync, rmSync } from 'node:fs';
import { freePort } from '../support/free_port.mjs';
import path from 'node:path';
import OpenAI from 'openai';
import { Agent, run, tool, setTracingDisabled } from '@openai/agents';
import { OpenAIChatCompletionsModel } from '@openai/agents-openai';
import { z } from 'zod';

const [areal, config, work] = process.argv.slice(2);
if (!areal || !config || !work) {
  console.error('usage: node agents_sdk_test.mjs AREAL_BINARY CONFIG WORK_DIR');
  process.exit(2);
}
setTracingDisabled(true);  // no traces sent anywhere: the test talks to loopback only
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
};
const deadline = Date.now() + 240_000;  // the whole test, bounded


const port = await freePort();
const base = `http://127.0.0.1:${port}`;
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });
const node = spawn(areal, ['--config', config, '--set', `run.output_dir=${work}`, '--set',
                           `nodes.local.http_port=${port}`], { stdio: ['ignore', 'inherit', 'inherit'] });
let exitCode = null;
const exited = new Promise((resolve) => node.on('exit', (code, signal) => {
  exitCode = code ?? 128;
  resolve();
}));
const killer = setTimeout(() => node.kill('SIGKILL'), 240_000);

// Up: /health answers.
for (let i = 0; ; ++i) {
  try {
    if ((await fetch(`${base}/health`)).ok) break;
  } catch {}
  if (i > 600 || exitCode !== null) {
    console.error('areal did not serve /health');
    process.exit(1);
  }
  await new Promise((r) => setTimeout(r, 100));
}

const sumTool = tool({
  name: 'add',
  description: 'Adds two integers.',
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  execute: async ({ a, b }) => String(a + b),
});

// One episode: two runs of the agent (a follow-up turn continues the history), then the reward.
const seen = [];  // per episode: group, index and the token ids / versions of each model call
async function episode(n) {
  const opened = await fetch(`${base}/rl/episodes`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ task: `task-${Math.floor(n / 2)}` }),
  });
  if (opened.status === 429) return 'gate';
  if (opened.status !== 200) return 'ended';
  const ep = await opened.json();
  const record = { group: ep.group, index: ep.index, calls: [], split: false };
  // The official client; its fetch keeps what the endpoint returned for each call.
  const client = new OpenAI({
    baseURL: `${base}/v1`, apiKey: 'none', defaultHeaders: { 'X-Episode-Id': ep.id }, maxRetries: 0,
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      if (String(url).endsWith('/chat/completions') && res.ok) {
        const body = await res.clone().json();
        const c = body.choices[0];
        record.calls.push({ token_ids: c.token_ids, token_versions: c.token_versions });
        record.split ||= Boolean(body.episode_split);
      }
      return res;
    },
  });
  const agent = new Agent({
    name: 'adder', instructions: 'Add the numbers with the add tool.', tools: [sumTool],
    model: new OpenAIChatCompletionsModel(client, 'areal'),
    modelSettings: { maxTokens: 12, temperature: 1.0 },
  });
  try {
    const first = await run(agent, `${n}+${n + 1}`, { maxTurns: 3 });
    await run(agent, [...first.history, { role: 'user', content: 'and once more' }], { maxTurns: 3 });
  } catch (e) {
    // Max turns (the untrained model may keep calling tools): the calls made still count.
    if (!String(e).includes('Max turns')) throw e;
  }
  const reward = n % 3 === 0 ? 1 : 0;
  const ended = await fetch(`${base}/rl/episodes/${ep.id}/end`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ reward }),
  });
  check(ended.status === 200, `episode ${ep.id}: end answered ${ended.status}`);
  seen.push(record);
  return 'done';
}

// Four agents at once until the run ends (the endpoint refuses new episodes).
let next = 0, stopped = false;
await Promise.all([0, 1, 2, 3].map(async () => {
  while (!stopped && Date.now() < deadline) {
    const n = next++;
    let r;
    // A refused or cut connection: the run ended and the node closed its endpoint
    // (areal's exit code is checked below; such an episode was never trained).
    // The code sits at some depth of the cause chain: our fetch's TypeError, or
    // the client's APIConnectionError around it.
    const closed = (e) => {
      for (let c = e, depth = 0; c && depth < 5; c = c.cause, ++depth)
        if (['ECONNREFUSED', 'ECONNRESET', 'UND_ERR_SOCKET'].includes(c.code)) return true;
      return false;
    };
    const attempt = () => episode(n).catch((e) => (closed(e) ? 'ended' : Promise.reject(e)));
    while ((r = await attempt()) === 'gate' && Date.now() < deadline) await new Promise((s) => setTimeout(s, 50));
    if (r !== 'done') stopped = true;
  }
}));
await exited;
clearTimeout(killer);
check(exitCode === 0, `areal exited with ${exitCode}`);

// The trained trajectories against what the client saw.
const file = path.join(work, 'agents-sdk', 'trajectories.jsonl');
check(existsSync(file), `${file} is missing`);
const lines = existsSync(file) ? readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l)) : [];
const summary = JSON.parse(readFileSync(path.join(work, 'agents-sdk', 'summary.json'), 'utf8'));
check(lines.length === summary.trained && lines.length > 0, `${lines.length} trajectories recorded, ${summary.trained} trained`);
let multiTurn = 0;
for (const t of lines) {
  const ep = seen.find((e) => e.group === t.group && e.index === t.index);
  check(ep !== undefined, `trajectory ${t.group}/${t.index} is not an episode the client ran`);
  if (!ep) continue;
  check(!ep.split, `episode ${t.group}/${t.index} was split`);
  const generated = [], versions = [];
  t.loss_mask.forEach((m, i) => {
    if (m === 1) {
      generated.push(t.output_tokens[i]);
      versions.push(t.token_versions[i]);
    } else {
      check(t.behaviour_logprobs[i] === 0, `a context token of ${t.group}/${t.index} has a log-probability`);
    }
  });
  const sawIds = ep.calls.flatMap((c) => c.token_ids);
  const sawVersions = ep.calls.flatMap((c) => c.token_versions);
  check(JSON.stringify(generated) === JSON.stringify(sawIds),
        `${t.group}/${t.index}: the trained tokens differ from the ones the endpoint returned`);
  check(JSON.stringify(versions) === JSON.stringify(sawVersions), `${t.group}/${t.index}: token versions differ`);
  check(t.batch - Math.min(...versions) <= summary.eta, `${t.group}/${t.index}: staler than eta`);
  if (ep.calls.length >= 2) multiTurn++;
}
check(multiTurn === lines.length, `${lines.length - multiTurn} trained episodes had fewer than two model calls`);
console.log(`agents SDK test: ${seen.length} episodes run, ${lines.length} trained, ${multiTurn} multi-turn, ` +
            `${failures.length} failures`);
for (const f of failures) console.error(`FAILED: ${f}`);
process.exit(failures.length === 0 ? 0 : 1);
