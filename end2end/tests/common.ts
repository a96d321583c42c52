import { type Page } from '@playwright/test';

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
