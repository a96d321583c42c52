import { test, expect, type Page, type APIRequestContext } from '@playwright/test';
import { PASSWORD, watchForErrors, TOKEN, SIM, api, ledger, newRun, act, stagePivot } from './common';

// The dashboard against `saga-harness demo`: each test stages its own run
// through the agent API, acts in the browser, and checks the simulated
// systems' own ledgers (what really happened), not only the page.

/** A run whose customer-visible charge was unwound: a correction waits. */
async function stageCorrection(request: APIRequestContext, purpose: string) {
  const run = await newRun(request, purpose);
  await act(request, run, 0, 'charge_card', {
    customer: 'cus_alan', amount: 1500, currency: 'usd', email: 'alan@example.com', receipt: true,
  });
  await api(request, 'POST', `/runs/${run}/unwind`, { reason: 'charged the wrong customer' });
  return run;
}

async function signIn(page: Page, who: string) {
  await page.goto('/login');
  await page.getByLabel('Username').fill(who);
  await page.getByLabel('Password').fill(PASSWORD);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('heading', { name: 'Runs' })).toBeVisible();
}


async function approveFlow(page: Page, request: APIRequestContext) {
  const { run } = await stagePivot(request, 'approve flow');
  await signIn(page, 'lead');
  await page.goto(`/runs/${run}`);
  await expect(page.getByRole('heading', { name: /Waiting for your decision: approve flow/ })).toBeVisible();
  await expect(page.getByText('capture_payment').first()).toBeVisible();
  await page.getByRole('button', { name: 'Approve' }).click();
  await expect(page.getByText(/approved by lead at/)).toBeVisible();
  await expect(page.getByRole('button', { name: 'Approve' })).toHaveCount(0);

  // Checked in the systems: the capture and the email happened, once each.
  const view = await api(request, 'GET', `/runs/${run}`);
  expect(view.run.status).toBe('COMPLETED');
  const captureKey = view.steps[2].idempotency_key;
  const emailKey = view.steps[3].idempotency_key;
  const captured = (await ledger(request, SIM.stripe)).filter((e) => e.action === 'payment_intent.captured' && e.key === captureKey);
  expect(captured).toHaveLength(1);
  const mails = (await ledger(request, SIM.mailbox)).filter((e) => e.key === emailKey);
  expect(mails).toHaveLength(1);
  return run;
}

async function sendCorrectionFlow(page: Page, request: APIRequestContext) {
  const run = await stageCorrection(request, 'send correction');
  await signIn(page, 'lead');
  await page.goto('/corrections');
  const card = page.locator('li.correction').filter({ has: page.locator(`a[href="/runs/${run}"]`) });
  await expect(card).toBeVisible();
  const key = (await card.locator('code.key').textContent())!;
  await card.getByLabel('Message (edit before sending)').fill('We refunded the 15.00 charge we made by mistake. Sorry!');
  await card.getByRole('button', { name: 'Send' }).click();
  await expect(page.getByRole('status')).toContainText('sent to alan@example.com');

  // The email went out once, under the correction's own key, edited.
  const mails = (await ledger(request, SIM.mailbox)).filter((e) => e.key === key);
  expect(mails).toHaveLength(1);
  expect(JSON.stringify(mails[0].detail.headers)).toContain(key);
  expect(mails[0].detail.body).toContain('15.00 charge we made by mistake');
}

test('a lead approves a pivot in one click and the commit steps run in the real systems', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const run = await approveFlow(page, request);
  await page.goto(`/runs/${run}`);
  await expect(page.locator('figure.timeline svg')).toBeVisible();
  // The runs list says who it was for and what the done steps moved.
  await page.goto('/');
  const row = page.locator('table.runs tbody tr').filter({ has: page.locator(`a[href="/runs/${run}"]`) });
  await expect(row).toContainText('cus_grace');
  await expect(row).toContainText('+$32.00');
  await expect(row.locator('.status')).toHaveText('done');
  await page.screenshot({ path: 'test-results/run-page.png', fullPage: true });
  expect(problems, 'browser errors (hydration, wasm)').toEqual([]);
});

test('the pivot panel reads as sentences a lead can check, on a desktop and on a phone', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const { run } = await stagePivot(request, 'in words');
  await signIn(page, 'lead');
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto(`/runs/${run}`);
  const panel = page.locator('section.pivot');
  // What is staged, above the commit steps, each a sentence.
  await expect(panel.locator('ul.staged')).toContainText("Hold $32.00 on cus_grace's card");
  await expect(panel.locator('ul.staged')).toContainText('Draft an email to grace@example.com: “Your replacement”');
  // The commit steps, with badges and the way back in words.
  const steps = panel.locator('ol.plan > li');
  await expect(steps.nth(0).locator('.sentence')).toHaveText(/^Capture \$32\.00 from the card hold /);
  await expect(steps.nth(0)).toContainText('If undone: refund $32.00');
  await expect(steps.nth(1).locator('.sentence')).toHaveText('Email grace@example.com: “Your replacement”');
  await expect(steps.nth(1).locator('.badge.reach')).toHaveText('reaches 1 recipient');
  await expect(steps.nth(1)).toContainText('If undone: a correction to grace@example.com');
  // The exact arguments are one click away, not in the way.
  const exact = steps.nth(0).locator('details.exact');
  await expect(exact.locator('pre.args')).toBeHidden();
  await exact.locator('summary').click();
  await expect(exact.locator('pre.args')).toContainText('"amount": 3200');
  await panel.screenshot({ path: 'test-results/pivot-panel-desktop.png' });

  // On a phone: nothing wider than the screen, and Approve / Reject in
  // reach before any scrolling.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`/runs/${run}`);
  await expect(page.getByRole('button', { name: 'Approve' })).toBeInViewport();
  await expect(page.getByRole('button', { name: 'Reject' })).toBeInViewport();
  const size = await page.evaluate(() => ({ width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight }));
  expect(size.width, 'no sideways scrolling').toBeLessThanOrEqual(390);
  expect(size.height, 'the page reads as cards, not a column of wrapped JSON').toBeLessThan(6000);
  await page.screenshot({ path: 'test-results/pivot-panel-phone.png' });
  await page.screenshot({ path: 'test-results/run-page-phone.png', fullPage: true });
  for (const path of ['/', '/corrections', '/audit']) {
    await page.goto(path);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    expect(width, `${path} fits a phone`).toBeLessThanOrEqual(390);
  }
  expect(problems).toEqual([]);
});

test('a lead fixes a sentence of the email before approving, and the email sent is the edited one', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const { run } = await stagePivot(request, 'edit flow');
  await signIn(page, 'lead');
  await page.goto(`/runs/${run}`);
  const panel = page.locator('section.pivot');
  const email = panel.locator('ol.plan > li').nth(1);
  const edit = email.locator('details.edit-step');
  const field = edit.getByLabel(/Arguments \(JSON\)/);
  await expect(field).toBeHidden();
  await edit.locator('summary').click();
  await expect(field).toHaveValue(/"body": "It ships today\."/);

  // Not JSON: refused with a reason, nothing changed.
  await field.fill('{"to": "grace@example.com", ');
  await edit.getByRole('button', { name: 'Save the edit' }).click();
  await expect(page.getByRole('alert').first()).toContainText('not JSON');
  await expect(page.getByText('Edited before deciding')).toHaveCount(0);

  // The page was redrawn: open the editor again unless it stayed open.
  const editor = page.locator('section.pivot ol.plan > li').nth(1).locator('details.edit-step');
  if (!(await editor.evaluate((d) => (d as HTMLDetailsElement).open))) {
    await editor.locator('summary').click();
  }
  await editor.getByLabel(/Arguments \(JSON\)/).fill(JSON.stringify({
    to: 'grace@example.com', subject: 'Your replacement', body: 'Your replacement lamp ships tomorrow morning.',
  }, null, 2));
  await editor.getByRole('button', { name: 'Save the edit' }).click();
  await expect(page.getByRole('status').first()).toContainText('Saved: lead changed body of step 3');
  const edits = page.locator('section.pivot ul.edits');
  await expect(edits).toContainText('It ships today.');
  await expect(edits).toContainText('Your replacement lamp ships tomorrow morning.');
  await panel.screenshot({ path: 'test-results/pivot-panel-edited.png' });

  await page.getByRole('button', { name: 'Approve' }).click();
  await expect(page.getByText(/approved by lead at/)).toBeVisible();
  const view = await api(request, 'GET', `/runs/${run}`);
  expect(view.run.status).toBe('COMPLETED');
  expect(view.pivot_edits).toHaveLength(1);
  expect(view.pivot_edits[0].changed).toEqual(['body']);
  const mails = (await ledger(request, SIM.mailbox)).filter((e) => e.key === view.steps[3].idempotency_key);
  expect(mails).toHaveLength(1);
  expect(mails[0].detail.body).toContain('ships tomorrow morning');
  expect(problems).toEqual([]);
});

test('rejecting a pivot with a reason unwinds the staged steps and tells the agent why', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const { run, draftKey, holdRef } = await stagePivot(request, 'reject flow');
  await signIn(page, 'lead');
  await page.goto(`/runs/${run}`);
  await expect(page.locator('section.pivot .if-reject')).toContainText('release the card hold');
  await page.getByLabel(/Why you reject/).fill('the customer asked for store credit instead');
  await page.getByRole('button', { name: 'Reject' }).click();
  await expect(page.getByText(/rejected by lead at/)).toBeVisible();

  const view = await api(request, 'GET', `/runs/${run}`);
  expect(view.run.status).toBe('UNWOUND');
  expect(view.pivot.note).toContain('the customer asked for store credit instead');
  const deleted = (await ledger(request, SIM.orders)).filter((e) => e.action === 'draft.deleted' && e.key === draftKey);
  expect(deleted).toHaveLength(1);
  const canceled = (await ledger(request, SIM.stripe)).filter((e) => e.action === 'payment_intent.canceled' && e.object === holdRef);
  expect(canceled).toHaveLength(1);
  expect(problems).toEqual([]);
});

test('a lead edits and sends a correction; another is dismissed with a reason and audited', async ({ page, request }) => {
  const problems = watchForErrors(page);
  await sendCorrectionFlow(page, request);

  const run = await stageCorrection(request, 'dismiss correction');
  await page.goto('/corrections');
  await page.screenshot({ path: 'test-results/inbox.png', fullPage: true });
  const card = page.locator('li.correction').filter({ has: page.locator(`a[href="/runs/${run}"]`) });
  const key = (await card.locator('code.key').textContent())!;
  await card.getByLabel('Reason to dismiss').fill('the customer was told by phone');
  await card.getByRole('button', { name: 'Dismiss' }).click();
  await expect(page.getByRole('status')).toContainText('dismissed');
  const mails = (await ledger(request, SIM.mailbox)).filter((e) => e.key === key);
  expect(mails).toHaveLength(0);

  await page.goto('/audit');
  await expect(page.getByText('the customer was told by phone')).toBeVisible();
  expect(problems).toEqual([]);
});

test('a viewer sees the pivot but cannot approve it, not even by a hand-made request', async ({ page, request, baseURL }) => {
  const { run } = await stagePivot(request, 'viewer flow');
  await signIn(page, 'viewer');
  await page.goto(`/runs/${run}`);
  await expect(page.getByRole('heading', { name: /Waiting for your decision: viewer flow/ })).toBeVisible();
  await expect(page.getByRole('button', { name: 'Approve' })).toHaveCount(0);
  await expect(page.getByText('Only an approver can decide this pivot.')).toBeVisible();

  const view = await api(request, 'GET', `/runs/${run}`);
  const refused = await page.request.post('/api/decide_pivot', {
    headers: { Origin: baseURL! },
    form: { run, approval: String(view.pivot.id), digest: view.pivot.digest, decision: 'approve' },
  });
  expect(refused.status()).toBe(403);
  const after = await api(request, 'GET', `/runs/${run}`);
  expect(after.run.status).toBe('AWAITING_APPROVAL');
});

test('the runs list puts waiting runs first', async ({ page }) => {
  await signIn(page, 'admin');
  // The demo stages its own runs as the server starts; wait for them.
  await expect(async () => {
    await page.reload();
    await expect(page.getByRole('link', { name: "Grace's lamp was lost in transit" })).toBeVisible({ timeout: 1000 });
  }).toPass({ timeout: 30_000 });
  const first = page.locator('table.runs tbody tr').first();
  await expect(first.locator('.status')).toHaveText(/^(waiting for approval|a step waits for approval)$/);
  await page.screenshot({ path: 'test-results/runs-list.png', fullPage: true });
});

test('a person answers a question and the commit that waited carries on', async ({ page }) => {
  const problems = watchForErrors(page);
  await signIn(page, 'lead');
  const link = page.getByRole('link', { name: 'Confirm the kettle replacement to Ada' });
  await expect(async () => {
    await page.reload();
    await expect(link).toBeVisible({ timeout: 1000 });
  }).toPass({ timeout: 30_000 });
  await link.click();
  // First on the page: what is uncertain, how to check, and what each answer does.
  const question = page.locator('section.attention');
  await expect(page.getByRole('heading', { name: 'Needs a person' })).toBeInViewport();
  await expect(question).toContainText('Nobody can tell whether this happened: Email ada@example.com: “Your replacement kettle”.');
  await expect(question).toContainText('How to check: Search the sent mail for the subject “Your replacement kettle” to ada@example.com');
  const answers = question.locator('dl.answers > div');
  await expect(answers.nth(0).locator('dt')).toHaveText('It happened:');
  await expect(answers.nth(0).locator('dd')).toHaveText('It is recorded as done, and the rest of the approved plan runs.');
  await expect(answers.nth(1).locator('dt')).toHaveText('It did not happen:');
  await expect(answers.nth(1).locator('dd')).toContainText('It is sent again under the same key');
  await page.getByRole('button', { name: 'It happened', exact: true }).click();
  await expect(page.getByRole('status').first()).toContainText('Recorded: step 0 happened.');
  await expect(page.locator('.run-head summary.status')).toHaveText('done');
  expect(problems).toEqual([]);
});

test('the inbox shows a new correction without a reload', async ({ page, request }) => {
  const problems = watchForErrors(page);
  await signIn(page, 'lead');
  // The page opens its stream once hydrated; wait for that before changing anything.
  const stream = page.waitForRequest((r) => r.url().endsWith('/dashboard/events'));
  await page.goto('/corrections');
  await expect(page.getByRole('heading', { name: 'Corrections waiting for sign-off' })).toBeVisible();
  await stream;
  const run = await stageCorrection(request, 'live update');
  await expect(page.locator(`li.correction a[href="/runs/${run}"]`)).toBeVisible({ timeout: 10_000 });
  expect(problems).toEqual([]);
});

test('HTML and script in tool arguments show as text and never run', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const script = '<script>window.__pwned = 1</script>';
  const image = '<img src=x onerror="window.__pwned = 2">';
  const svg = '"><svg onload="window.__pwned = 3">';
  const run = await newRun(request, `hostile ${script}${image}`);
  await act(request, run, 0, 'create_email_draft', { to: 'grace@example.com', subject: script, body: `${image} ${svg}` });
  await signIn(page, 'lead');
  for (const path of [`/runs/${run}`, '/', '/audit?all=1']) {
    await page.goto(path);
    await page.waitForLoadState('load');
    // The text is on the page, as text.
    await expect(page.getByText(script, { exact: false }).first()).toBeVisible();
    // Nothing of it became an element, and nothing of it ran.
    await expect(page.locator('main script, main img[src="x"], main svg[onload]')).toHaveCount(0);
    expect(await page.evaluate(() => (window as any).__pwned), path).toBeUndefined();
  }
  await page.goto(`/runs/${run}`);
  await expect(page.locator('pre.args').first()).toContainText(script);
  await expect(page.locator('pre.args').first()).toContainText('<img src=x onerror=');
  expect(problems).toEqual([]);
});

test('a correction whose send was cut off waits for a person, who says it went out', async ({ page, request }) => {
  const problems = watchForErrors(page);
  const run = await stageCorrection(request, 'cut-off correction');
  await signIn(page, 'lead');
  await page.goto('/corrections');
  const card = page.locator('li.correction').filter({ has: page.locator(`a[href="/runs/${run}"]`) });
  await expect(card).toBeVisible();
  const key = (await card.locator('code.key').textContent())!;
  // The mail server takes the message, then drops the line before its reply.
  const fault = await request.post(`${SIM.mailbox}/_sim/faults`, { data: { drop_after_data: 1 } });
  expect(fault.status()).toBe(204);
  await card.getByRole('button', { name: 'Send', exact: true }).click();
  await expect(page.getByRole('status')).toContainText('its send is unknown');
  await expect(card.getByText('Did this correction reach its recipients?')).toBeVisible();
  // SMTP has no lookup; asking again cannot settle it.
  await card.getByRole('button', { name: 'Ask the system again' }).click();
  await expect(card.getByText('Did this correction reach its recipients?')).toBeVisible();
  // The recipient did get it: the person checks and says so.
  expect((await ledger(request, SIM.mailbox)).filter((e) => e.key === key)).toHaveLength(1);
  await card.getByRole('button', { name: 'It went out' }).click();
  await expect(page.getByRole('status')).toContainText('went out');
  await expect(card).toHaveCount(0);
  // Nothing was sent a second time.
  expect((await ledger(request, SIM.mailbox)).filter((e) => e.key === key)).toHaveLength(1);
  expect(problems).toEqual([]);
});

test.describe('without JavaScript', () => {
  test.use({ javaScriptEnabled: false });

  test('approving a pivot and sending a correction still work', async ({ page, request }) => {
    await approveFlow(page, request);
    await sendCorrectionFlow(page, request);
  });
});
