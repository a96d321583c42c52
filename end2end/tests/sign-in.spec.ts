import { test, expect, type Page } from '@playwright/test';

async function signIn(page: Page, password: string) {
  await page.getByLabel('Username').fill('dana');
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

test('a support lead signs in, sees the empty runs list and signs out', async ({ page }) => {
  const problems: string[] = [];
  page.on('pageerror', (err) => problems.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(msg.text());
  });

  await page.goto('/');
  await expect(page).toHaveURL(/\/login$/);
  await expect(page.getByRole('heading', { name: 'Saga Harness' })).toBeVisible();

  await signIn(page, 'not the password');
  await expect(page.getByRole('alert')).toHaveText('Wrong username or password.');
  await expect(page).toHaveURL(/\/login\?error=1$/);

  await signIn(page, 'correct horse battery');
  await expect(page.getByRole('heading', { name: 'Runs' })).toBeVisible();
  await expect(page.getByText('No runs yet.')).toBeVisible();
  await expect(page.getByText('dana · approver')).toBeVisible();
  await page.screenshot({ path: 'test-results/runs-empty.png', fullPage: true });

  await page.getByRole('button', { name: 'Sign out' }).click();
  await expect(page).toHaveURL(/\/login$/);
  await page.goto('/');
  await expect(page).toHaveURL(/\/login$/);

  expect(problems, 'browser errors (hydration, wasm)').toEqual([]);
});

test.describe('without JavaScript', () => {
  test.use({ javaScriptEnabled: false });

  test('signing in and out still works', async ({ page }) => {
    await page.goto('/login');
    await signIn(page, 'wrong again');
    await expect(page.getByRole('alert')).toHaveText('Wrong username or password.');
    await signIn(page, 'correct horse battery');
    await expect(page.getByText('No runs yet.')).toBeVisible();
    await page.getByRole('button', { name: 'Sign out' }).click();
    await expect(page).toHaveURL(/\/login$/);
  });
});
