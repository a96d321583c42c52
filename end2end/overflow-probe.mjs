import { chromium } from 'playwright-core';
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox','--disable-gpu','--disable-background-networking','--disable-component-update','--disable-sync','--no-first-run'] });
const page = await browser.newPage({ viewport: { width: 390, height: 844 } });
const base = process.argv[2];
await page.goto(base + '/login');
await page.getByLabel('Username').fill('lead');
await page.getByLabel('Password').fill('correct horse battery');
await page.getByRole('button', { name: 'Sign in' }).click();
await page.waitForTimeout(1500);
for (const path of process.argv.slice(3)) {
  await page.goto(base + path);
  await page.waitForTimeout(1000);
  const wide = await page.evaluate(() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391).slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right) + ' ' + (e.textContent||'').slice(0,60)));
  console.log(path, document === undefined ? '' : '', JSON.stringify(wide, null, 1));
  await page.screenshot({ path: '/tmp/shot' + path.replace(/\W/g,'_') + '.png', fullPage: true });
}
await browser.close();
