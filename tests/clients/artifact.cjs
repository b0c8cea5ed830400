// Drives the artifact clients real actions are built on, in a job's step environment.
//
//   node artifact.cjs v4 upload NAME ROOT FILE...   @actions/artifact 2.x (upload-artifact@v4)
//   node artifact.cjs v4 download NAME DEST
//   node artifact.cjs v3 upload NAME ROOT FILE...   @actions/artifact 1.x (upload-artifact@v3)
//   node artifact.cjs v3 download NAME DEST
//
// Prints one JSON line with the client's answer. The 2.x client refuses every server whose
// GITHUB_SERVER_URL is not GitHub's (its isGhes() host test), and so refuses Gitea; act_runner
// edits that test out of an action's bundle. `--patched` does the equivalent here by showing
// that one test a GitHub host: nothing else in the client reads GITHUB_SERVER_URL.
'use strict'
const path = require('path')

async function main(argv) {
  const patched = argv.includes('--patched')
  const [version, command, name, ...rest] = argv.filter(a => a !== '--patched')
  if (patched) process.env.GITHUB_SERVER_URL = 'https://github.com'
  if (version === 'v4') {
    const {DefaultArtifactClient} = require('@actions/artifact')
    const client = new DefaultArtifactClient()
    if (command === 'upload') {
      const [root, ...files] = rest
      return client.uploadArtifact(name, files.map(f => path.resolve(root, f)), root, {retentionDays: 1})
    }
    if (command === 'download') {
      const {artifact} = await client.getArtifact(name)
      const result = await client.downloadArtifact(artifact.id, {path: rest[0]})
      return {id: artifact.id, size: artifact.size, ...result}
    }
    if (command === 'list') return client.listArtifacts()
  }
  if (version === 'v3') {
    const client = require('artifact-v1').create()
    if (command === 'upload') {
      const [root, ...files] = rest
      return client.uploadArtifact(name, files.map(f => path.resolve(root, f)), root, {continueOnError: false})
    }
    if (command === 'download') return client.downloadArtifact(name, rest[0])
  }
  throw new Error(`usage: artifact.cjs v3|v4 upload|download|list NAME ... (got ${argv.join(' ')})`)
}

main(process.argv.slice(2)).then(
  result => console.log(JSON.stringify(result)),
  error => {
    console.error(`artifact client failed: ${error && error.stack ? error.stack : error}`)
    process.exit(1)
  }
)
