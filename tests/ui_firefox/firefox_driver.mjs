// Drives Debian's firefox-esr for tests/ui_firefox: headless, over WebDriver BiDi, through npm's
// puppeteer-core (which never downloads a browser). Python (firefox_testlib.py) starts this
// script and talks to it in JSON lines: one command a line on stdin, one reply a line on stdout
// ({id, ok: true, value} or {id, ok: false, error}); puppeteer's own output goes to stderr.
//
//   node firefox_driver.mjs '{"executablePath": "/usr/bin/firefox-esr"}'
//
// Commands (every one names its page but open/blocked/quit, and carries timeoutMs):
//   open {url, privateContext?} -> page id (privateContext: a new browser context, with its
//        own storage, as a private window has: no Cache API entries from the other pages)
//   evaluate {source, arg}      -> the value of source (a function, called with arg, or an
//                                  expression), awaited
//   waitForFunction {source, arg} -> its first truthy value, polled every POLL_MS
//   click {selector}            a real click, once the element is visible and enabled
//   select {selector, value}    choose an <option>
//   reload                      load the page again
//   screenshot {path}           a full-page PNG
//   log                         -> {console: [...], errors: [...]} since the page opened
//   close                       close the page
//   blocked                     -> the URLs the browser asked for off 127.0.0.1 (see below)
//   quit                        close the browser and exit
//
// Off-host requests. Firefox is pointed at a proxy in this process for every scheme it can
// proxy; the proxy records what it is asked for and refuses it. Requests to 127.0.0.1 (the
// test server) never go through a proxy in Firefox, so the page's own traffic is untouched,
// workers' included, and nothing reaches the network.
import http from "node:http";
import readline from "node:readline";

import puppeteer from "puppeteer-core";

const POLL_MS = 100;
const config = JSON.parse(process.argv[2] || "{}");

const blockedUrls = [];
const refusingProxy = http.createServer((request, response) => {
  blockedUrls.push(request.url);
  response.writeHead(403, { "content-type": "text/plain" });
  response.end("blocked by the candle-web test proxy\n");
});
refusingProxy.on("connect", (request, socket) => {
  blockedUrls.push(`https://${request.url}`);
  socket.end("HTTP/1.1 403 Forbidden\r\n\r\n");
});
await new Promise((resolve) => refusingProxy.listen(0, "127.0.0.1", resolve));
const proxyPort = refusingProxy.address().port;

const browser = await puppeteer.launch({
  browser: "firefox",
  protocol: "webDriverBiDi",
  executablePath: config.executablePath,
  headless: true,
  // Release builds ignore services.settings.server (below) unless this is set.
  env: { ...process.env, MOZ_REMOTE_SETTINGS_DEVTOOLS: "1" },
  extraPrefsFirefox: {
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": proxyPort,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": proxyPort,
    "network.proxy.share_proxy_settings": true,
    "network.dns.disablePrefetch": true,
    "network.prefetch-next": false,
    // Firefox's own remote settings (blocklists, etc.): the dummy server its test harness uses.
    "services.settings.server": "data:,#remote-settings-dummy/v1",
    ...(config.prefs || {}),
  },
});

const pages = new Map();
let nextPageId = 1;

async function openPage({ url, privateContext }) {
  const context = privateContext ? await browser.createBrowserContext() : null;
  const page = context ? await context.newPage() : await browser.newPage();
  const log = { console: [], errors: [] };
  page.on("console", (message) => log.console.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => log.errors.push(String(error.message || error)));
  await page.setViewport({ width: 1280, height: 800 });
  await page.goto(url, { waitUntil: "load" });
  const id = nextPageId++;
  pages.set(id, { page, log, context });
  return id;
}

// The page-side wrapper: `source` is a function (called with the argument) or an expression.
function callExpression(source, arg) {
  return `(async () => { const f = (${source});
    return typeof f === "function" ? await f(${JSON.stringify(arg ?? null)}) : f; })()`;
}

function pollExpression(source, arg) {
  return `(() => { const f = (${source});
    return typeof f === "function" ? f(${JSON.stringify(arg ?? null)}) : f; })()`;
}

function withTimeout(promise, timeoutMs, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${timeoutMs} ms`)), timeoutMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

const COMMANDS = {
  open: (command) => openPage(command),
  evaluate: ({ page, source, arg }) => page.evaluate(callExpression(source, arg)),
  waitForFunction: async ({ page, source, arg, timeoutMs }) => {
    const handle = await page.waitForFunction(pollExpression(source, arg),
                                              { polling: POLL_MS, timeout: timeoutMs });
    const value = await handle.jsonValue();
    await handle.dispose();
    return value;
  },
  click: ({ page, selector, timeoutMs }) => page.locator(selector).setTimeout(timeoutMs).click(),
  select: ({ page, selector, value }) => page.select(selector, value),
  reload: ({ page }) => page.reload({ waitUntil: "load" }),
  viewport: ({ page, width, height }) => page.setViewport({ width, height }),
  screenshot: ({ page, path }) => page.screenshot({ path, fullPage: true }).then(() => path),
  log: ({ entry }) => entry.log,
  close: async ({ entry, pageId }) => {
    pages.delete(pageId);
    await entry.page.close();
    if (entry.context) await entry.context.close();
  },
  blocked: () => [...blockedUrls],
};

async function run(command) {
  if (command.op === "quit") return null;
  const handler = COMMANDS[command.op];
  if (!handler) throw new Error(`unknown command ${command.op}`);
  const entry = command.page === undefined ? null : pages.get(command.page);
  if (command.page !== undefined && !entry) throw new Error(`no page ${command.page}`);
  const timeoutMs = command.timeoutMs ?? 30_000;
  return withTimeout(handler({ ...command, pageId: command.page, entry, page: entry?.page,
                               timeoutMs }),
                     timeoutMs, command.op);
}

function reply(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

async function quit(code) {
  await browser.close().catch(() => {});
  refusingProxy.close();
  process.exit(code);
}

reply({ id: 0, ok: true, value: { version: await browser.version(),
                                  browserPid: browser.process()?.pid ?? null } });

const lines = readline.createInterface({ input: process.stdin });
// One command at a time, in order: the Python side waits for each reply.
for await (const line of lines) {
  if (!line.trim()) continue;
  const command = JSON.parse(line);
  try {
    const value = await run(command);
    reply({ id: command.id, ok: true, value: value ?? null });
  } catch (error) {
    reply({ id: command.id, ok: false, error: `${error.name}: ${error.message}` });
  }
  if (command.op === "quit") break;
}
await quit(0); // stdin closed (the test process went away) or quit asked for
