import { test, expect } from '@playwright/test';
import { watchForErrors, SIM, api, ledger, stagePivot } from './common';

// Signing in with the company's identity provider: a real OpenID provider
// (oidc-provider from npm, end2end/oidc/provider.mjs) that the demo is
// configured to use, in Chromium, through its own sign-in page.

async function signInAtProvider(page: import('@playwright/test').Page, who: string) {
  await page.goto('/login');
  await page.getByRole('link', { name: 'Sign in with Example SSO' }).click();
  // The provider's own page, on its own address.
  await expect(page).toHaveURL(/127\.0\.0\.1:3919\/interaction\//);
  await page.locator('input[name="login"]').fill(who);
  await page.locator('input[name="password"]').fill('any password at all');
  await page.getByRole('button', { name: 'Sign-in' }).click();
}

test('a support lead signs in through the identity provider and approves a pivot', async ({ page, request }) => {
  const { run } = await stagePivot(request, 'company sign-in');
  await signInAtProvider(page, 'ada');
  await expect(page.getByRole('heading', { name: 'Runs' })).toBeVisible();
  // Watched from here: the provider's own pages are not ours.
  const problems = watchForErrors(page);
  await page.goto(`/runs/${run}`);
  await page.getByRole('button', { name: 'Approve' }).click();
  await expect(page.getByText(/approved by ada@example\.com at/)).toBeVisible();

  // The capture happened in the payment system, once.
  const view = await api(request, 'GET', `/runs/${run}`);
  expect(view.run.status).toBe('COMPLETED');
  const captureKey = view.steps[2].idempotency_key;
  const captured = (await ledger(request, SIM.stripe)).filter((e) => e.action === 'payment_intent.captured' && e.key === captureKey);
  expect(captured).toHaveLength(1);
  expect(problems, 'browser errors (hydration, wasm)').toEqual([]);
});

test('someone in no group that may use the harness is told so and is not let in', async ({ page }) => {
  await signInAtProvider(page, 'mo');
  await expect(page.getByRole('alert')).toHaveText(
    'You signed in, but none of your groups may use Saga Harness. Ask an administrator to add you to a group that may.',
  );
  await page.goto('/');
  await expect(page).toHaveURL(/\/login$/);
});
