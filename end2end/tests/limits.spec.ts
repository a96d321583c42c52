import { test, expect } from '@playwright/test';
import { PASSWORD, watchForErrors, SIM, api, ledger, newRun } from './common';

// Limits on the sum of correct calls, against `saga-harness demo` and its
// shipped tools file (card charges: $5,000.00 per agent per day). A call
// that would cross one is held for a person, who reads why in words on
// the run page; what really happened is read from Stripe's own ledger.

const SENTENCE = /This would take demo-agent's card charges in the last 24 hours to \$5,\d{3}\.\d{2} of \$5,000\.00/;

for (const size of [{ name: 'laptop', width: 1366, height: 768 }, { name: 'phone', width: 390, height: 844 }]) {
  test(`a charge over a limit waits for a person who reads why and rejects it (${size.name})`, async ({ page, request }) => {
    const problems = watchForErrors(page);
    await page.setViewportSize({ width: size.width, height: size.height });
    const run = await newRun(request, `bulk kettles ${size.name}`);
    const held = await api(request, 'POST', `/runs/${run}/calls`, {
      tool: 'charge_card', step: 0,
      args: { customer: 'cus_lena', amount: 520000, currency: 'usd', email: 'lena@example.com', receipt: true },
    });
    expect(held.outcome).toBe('held_over_limit');
    expect(held.limit.limit).toBe('card charges');
    expect(held.limit.amount).toBe(520000);
    expect(held.limit.max).toBe(500000);
    expect(held.limit.words).toMatch(/this would take demo-agent's card charges in the last 24 hours to \$5,\d{3}\.\d{2} of \$5,000\.00/);

    await page.goto('/login');
    await page.getByLabel('Username').fill('lead');
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await expect(page.getByRole('heading', { name: 'Runs' })).toBeVisible();
    await page.goto(`/runs/${run}`);
    const heading = page.getByRole('heading', { name: SENTENCE });
    await expect(heading).toBeVisible();
    // The decision is in the first screen, and the limit's spending is shown.
    const reject = page.getByRole('button', { name: 'Reject' });
    await expect(reject).toBeInViewport();
    const limits = page.getByRole('region', { name: 'Limits' });
    await expect(limits).toContainText('card charges');
    await expect(limits).toContainText('of $5,000.00');
    await page.screenshot({ path: `test-results/limit-held-${size.name}.png` });
    await reject.click();
    await expect(page.getByRole('button', { name: 'Reject' })).toHaveCount(0);

    // Checked in Stripe: no charge was made under the step's key.
    const view = await api(request, 'GET', `/runs/${run}`);
    expect(view.steps[0].status).toBe('REJECTED');
    const key = view.steps[0].idempotency_key;
    const charges = (await ledger(request, SIM.stripe)).filter((e) => e.key === key);
    expect(charges).toHaveLength(0);
    expect(problems).toEqual([]);
  });
}
