import { test, expect, type Page } from '@playwright/test';
import { PASSWORD, watchForErrors } from './common';

// What a support lead reads on the demo's own runs, at a desk (1366×768)
// and on a phone (390×844): the pivot's summary with Approve in the first
// screen, an unwound run's reason at the top, the inbox grouped by who saw
// the original, and words where constants used to be. Runs first among the
// dashboard's tests, before any of them decides a demo run.
//
// With SAGA_SCREENSHOTS_DIR set, the README's screenshots are written
// there (`scripts/screenshots.sh`); otherwise into test-results.

const SHOTS = process.env.SAGA_SCREENSHOTS_DIR ?? 'test-results';

const SIZES = [
  { name: 'desktop', width: 1366, height: 768 },
  { name: 'phone', width: 390, height: 844 },
];

/** Status constants and keys a lead should never have to read. */
const CONSTANT = /\b(AWAITING_APPROVAL|NEEDS_ATTENTION|NOT_EXECUTED|COMPENSATED|CONFIRMED|UNWOUND|UNWINDING|COMMITTING|INTENDED|UNKNOWN)\b/;
const KEY = /\b[0-9a-f]{32}\b|\b[0-9a-f]{8}…/;

async function signIn(page: Page) {
  await page.goto('/login');
  await page.getByLabel('Username').fill('lead');
  await page.getByLabel('Password').fill(PASSWORD);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('heading', { name: 'Runs' })).toBeVisible();
  // The demo stages its runs as the server starts; wait for the last one.
  await expect(async () => {
    await page.reload();
    await expect(page.getByRole('link', { name: 'Confirm the kettle replacement to Ada' })).toBeVisible({ timeout: 1000 });
  }).toPass({ timeout: 30_000 });
}


/** What a lead reads: the page's rendered text, closed disclosures excluded. */
async function readable(page: Page): Promise<string> {
  return page.locator('main').innerText();
}

async function noSidewaysScroll(page: Page, width: number) {
  const scrollWidth = await page.evaluate(() => document.documentElement.scrollWidth);
  expect(scrollWidth, 'no sideways scrolling of the page').toBeLessThanOrEqual(width);
}

for (const size of SIZES) {
  test.describe(`at ${size.width}×${size.height}`, () => {
    test.use({ viewport: { width: size.width, height: size.height } });

    test(`the pivot reads in five seconds and Approve is in the first screen (${size.name})`, async ({ page }) => {
      const problems = watchForErrors(page);
      await signIn(page);
      // A run opens by its label.
      await page.goto('/runs/demo-reship-lamp');
      const panel = page.locator('section.pivot');
      await expect(panel.getByRole('heading', { level: 2 })).toHaveText(/^Waiting for your decision: Reship Grace's lamp/);
      const glance = panel.locator('dl.glance');
      await expect(glance).toContainText('+$32.00 captured');
      await expect(glance).toContainText('−$5.00 refunded');
      await expect(glance).toContainText('+$27.00 net');
      await expect(glance).toContainText('$32.00 held on the card now');
      await expect(glance).toContainText('grace@example.com');
      await expect(glance).toContainText('Stripe');
      await expect(panel.locator('.if-approve')).toContainText('If you approve, in this order: 1 ship LAMP-7 again for order ord_1002; 2 capture $32.00 from the card hold pi_');
      await expect(panel.locator('.if-reject')).toContainText('If you reject: nothing in the plan is sent; what the run staged is taken back (delete the ticket draft; delete the email draft; release the card hold)');
      // Both decisions in reach before any scrolling.
      await expect(page.getByRole('button', { name: 'Approve' })).toBeInViewport();
      await expect(page.getByRole('button', { name: 'Reject' })).toBeInViewport();
      // The customer's email as they will read it, and the hold by name.
      await expect(panel.locator('.message')).toContainText('Your replacement lamp');
      await expect(panel.locator('.message')).toContainText('A new lamp ships today; the shipping fee is refunded.');
      await expect(panel.locator('ol.plan > li').nth(1).locator('.sentence')).toHaveText(/^Capture \$32\.00 from the card hold pi_\w+ \(step 2\)$/);
      const text = await readable(page);
      expect(text).not.toMatch(CONSTANT);
      expect(text).not.toMatch(KEY);
      await noSidewaysScroll(page, size.width);
      await page.screenshot({ path: `${SHOTS}/pivot-${size.name}.png` });
      expect(problems, 'browser errors (hydration, wasm)').toEqual([]);
    });

    test(`an unwound run says why at the top and tells each step as one account (${size.name})`, async ({ page }) => {
      const problems = watchForErrors(page);
      await signIn(page);
      await page.goto('/runs/demo-incident-kettle');
      const why = page.locator('section.why');
      await expect(why).toBeInViewport();
      await expect(why).toContainText(/^Taken back: /);
      await expect(why).toContainText('Started by agent demo-agent');
      await expect(page.locator('.run-head summary.status')).toHaveText('taken back');
      const steps = page.locator('ol.steps');
      await expect(steps).toContainText('the harness looked it up in Jira by its key: it had happened (SUP-');
      await expect(steps).toContainText('the unwind took it back (close the Jira ticket SUP-');
      // The constant is one tap away for engineers.
      const status = steps.locator('details.status-words').first();
      await status.locator('summary').click();
      await expect(status.locator('code')).toHaveText(/^[A-Z_]+$/);
      await status.locator('summary').click();
      const text = await readable(page);
      expect(text).not.toMatch(CONSTANT);
      expect(text).not.toMatch(KEY);
      // On a phone the chart scrolls inside its box and says so.
      if (size.width < 800) {
        await expect(page.locator('.scroll-cue')).toBeVisible();
      } else {
        await expect(page.locator('.scroll-cue')).toBeHidden();
      }
      await noSidewaysScroll(page, size.width);
      await page.screenshot({ path: `${SHOTS}/unwound-${size.name}.png` });
      expect(problems).toEqual([]);
    });

    test(`the inbox groups corrections by who saw the original, each with its why (${size.name})`, async ({ page }) => {
      const problems = watchForErrors(page);
      await signIn(page);
      await page.goto('/corrections');
      const headings = page.locator('section.audience-group > h2');
      await expect(headings).toHaveText([/^Customers · 1 correction$/, /^Finance · 2 corrections$/]);
      const customer = page.locator('#audience-customer li.correction').first();
      await expect(customer).toContainText('Why: the run was taken back: no refund was made for these mugs');
      await expect(customer).toContainText('Email alan@example.com: “Your mugs are refunded”: done, and it cannot be undone');
      await expect(customer).toContainText('Subject: A correction to our earlier message');
      await expect(customer).toContainText('To: alan@example.com');
      await expect(page.locator('#audience-finance li.correction').first()).toContainText('Why: the run was taken back:');
      const text = await readable(page);
      expect(text).not.toMatch(CONSTANT);
      expect(text).not.toMatch(KEY);
      await noSidewaysScroll(page, size.width);
      await page.screenshot({ path: `${SHOTS}/inbox-${size.name}.png` });
      expect(problems).toEqual([]);
    });

    test(`the runs list reads in words, counts what waits for a person, and finds a customer (${size.name})`, async ({ page }) => {
      const problems = watchForErrors(page);
      await signIn(page);
      const rows = page.locator('table.runs tbody tr');
      await expect(rows.first().locator('.status')).toHaveText('waiting for approval');
      await expect(page.locator('table.runs')).toContainText('needs a person');
      await expect(page.locator('table.runs')).toContainText('Taken back: no refund was made for these mugs');
      // The pivot and the question: both wait for a person.
      await expect(page.locator('nav a[href="/"] .count')).toHaveText('2');
      expect(await readable(page)).not.toMatch(CONSTANT);
      await page.getByRole('searchbox').fill('cus_grace');
      await page.getByRole('button', { name: 'Show' }).click();
      await expect(rows).toHaveCount(1);
      await expect(rows.first()).toContainText("Grace's lamp was lost in transit");
      await noSidewaysScroll(page, size.width);
      // An unknown label says so in words.
      await page.goto('/runs/no-such-run');
      await expect(page.getByRole('alert')).toHaveText('There is no run with the id or label “no-such-run”.');
      expect(problems.filter((p) => !p.includes('404'))).toEqual([]);
    });
  });
}
