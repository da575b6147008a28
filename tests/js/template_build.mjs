// Builds a template with the stock npm `e2b` SDK's builder and starts a sandbox from it, as a
// JavaScript user would. Run by tests/integration/test_templates.py, which points the SDK at
// the test server (E2B_API_URL, E2B_API_KEY) and reads the JSON this prints.
//   node template_build.mjs NAME CONTEXT_DIR PROXY_HOST
import http from 'node:http'
import { Sandbox, Template, waitForPort } from 'e2b'

const [name, context, proxyHost] = process.argv.slice(2)
const logs = []
const template = Template({ fileContextPath: context })
  .fromTemplate('base')
  .copy('site/', '/srv/site/')
  .setEnvs({ GREETING: 'hello-from-js' })
  .setWorkdir('/srv/site')
  .runCmd('echo "$GREETING" > greeting.txt')
  .setStartCmd('python3 -m http.server 8080', waitForPort(8080))
const info = await Template.build(template, name, {
  onBuildLogs: (entry) => logs.push(String(entry.message)),
})

// The proxy routes by Host, as it would for `sandbox.getHost(8080)` under a real domain.
function get(sandboxId, path) {
  return new Promise((resolve, reject) => {
    const req = http.get(
      { host: proxyHost.split(':')[0], port: proxyHost.split(':')[1], path,
        headers: { Host: `8080-${sandboxId}.airlock.test` } },
      (res) => {
        let body = ''
        res.on('data', (d) => { body += d })
        res.on('end', () => resolve({ status: res.statusCode, body }))
      })
    req.on('error', reject)
  })
}

const sandbox = await Sandbox.create(name)
try {
  const first = await get(sandbox.sandboxId, '/index.html')
  const run = await sandbox.commands.run('pwd; cat greeting.txt; echo $GREETING')
  console.log(JSON.stringify({
    templateId: info.templateId,
    exists: await Template.exists(name),
    logs,
    first,
    stdout: run.stdout,
  }))
} finally {
  await sandbox.kill()
}
