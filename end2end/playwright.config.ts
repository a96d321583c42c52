import { defineConfig } from '@playwright/test';

// The dashboard, served by the real binary on a fresh SQLite file, driven in
// Debian's Chromium (Playwright's own browser download is not used).
const port = Number(process.env.SAGA_E2E_PORT ?? 3917);
// The demo (simulators, staged runs) for the dashboard tests.
const demoPort = Number(process.env.SAGA_E2E_DEMO_PORT ?? 3918);
// The OpenID provider the demo signs people in with (see oidc/provider.mjs).
const oidcPort = 3919;

export default defineConfig({
  testDir: './tests',
  timeout: 30_000,
  retries: 0,
  workers: 1,
  reporter: [['list']],
  outputDir: './test-results',
  projects: [
    { name: 'sign-in', testMatch: /(^|\/)sign-in\.spec\.ts/, use: { baseURL: `http://127.0.0.1:${port}` } },
    { name: 'dashboard', testMatch: /(at-a-glance|dashboard|company-sign-in|limits)\.spec\.ts/, use: { baseURL: `http://127.0.0.1:${demoPort}` } },
  ],
  use: {
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
      ],
    },
  },
  webServer: [
    {
      command: 'node ./oidc/provider.mjs',
      url: `http://127.0.0.1:${oidcPort}/.well-known/openid-configuration`,
      env: {
        OIDC_PORT: String(oidcPort),
        OIDC_CLIENT_ID: 'saga-harness-e2e',
        OIDC_CLIENT_SECRET: 'a-client-secret-only-the-browser-tests-use',
        OIDC_REDIRECT_URI: `http://127.0.0.1:${demoPort}/auth/oidc/callback`,
      },
      reuseExistingServer: false,
      timeout: 30_000,
      stdout: 'pipe',
      stderr: 'pipe',
    },
    {
      command: `bash ./serve-for-tests.sh ${port}`,
      url: `http://127.0.0.1:${port}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
      stdout: 'pipe',
      stderr: 'pipe',
    },
    {
      command: `bash ./serve-demo-for-tests.sh ${demoPort}`,
      url: `http://127.0.0.1:${demoPort}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
      stdout: 'pipe',
      stderr: 'pipe',
    },
  ],
});
