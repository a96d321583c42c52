import { expect, type Page, type APIRequestContext } from '@playwright/test';

// What every dashboard test shares: the demo's password and a watch on
// the browser's errors (a hydration panic, a failed wasm load).

export const PASSWORD = 'correct horse battery';

/** Every page error and console error from now on, to assert empty. */
export function watchForErrors(page: Page) {
  const problems: string[] = [];
  page.on('pageerror', (err) => problems.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(msg.text());
  });
  return problems;
}

// The demo's agent, its simulated systems, and runs staged through the
// agent API.

export const TOKEN = 'sh_e2e_demo_agent_token';
export const SIM = {
  stripe: 'http://127.0.0.1:4301',
  orders: 'http://127.0.0.1:4306',
  mailbox: 'http://127.0.0.1:4308',
};

export type Effect = { system: string; action: string; key: string | null; object: string; detail: any };

export async function api(request: APIRequestContext, method: 'GET' | 'POST', path: string, data?: unknown) {
  const response = await request.fetch(`/api/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}` },
    data,
  });
  const body = await response.json();
  expect(response.status(), `${method} ${path}: ${JSON.stringify(body)}`).toBeLessThan(300);
  return body;
}

export async function ledger(request: APIRequestContext, base: string): Promise<Effect[]> {
  return (await request.get(`${base}/_sim/ledger`)).json();
}

export async function newRun(request: APIRequestContext, purpose: string): Promise<string> {
  const created = await api(request, 'POST', '/runs', { label: `${purpose} ${Date.now()}-${Math.random()}`, purpose });
  return created.run.id;
}

export async function act(request: APIRequestContext, run: string, step: number, tool: string, args: unknown) {
  const out = await api(request, 'POST', `/runs/${run}/calls`, { tool, args, step });
  expect(out.outcome, JSON.stringify(out)).toBe('confirmed');
  return out;
}

/** A run with a draft and a card hold staged, and a pivot proposed. */
export async function stagePivot(request: APIRequestContext, purpose: string) {
  const run = await newRun(request, purpose);
  const draft = await act(request, run, 0, 'create_email_draft', {
    to: 'grace@example.com', subject: 'Your replacement', body: 'A new lamp ships today.',
  });
  const hold = await act(request, run, 1, 'authorize_payment', {
    customer: 'cus_grace', amount: 3200, currency: 'usd',
  });
  await api(request, 'POST', `/runs/${run}/pivot`, {
    summary: `${purpose}: capture the hold and tell Grace`,
    commit: [
      { tool: 'capture_payment', args: { intent_key: hold.key, amount: 3200 } },
      { tool: 'send_email', args: { to: 'grace@example.com', subject: 'Your replacement', body: 'It ships today.' } },
    ],
  });
  return { run, draftKey: draft.key as string, holdRef: hold.external_ref as string };
}
