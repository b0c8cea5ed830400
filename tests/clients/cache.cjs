// Drives @actions/cache (what actions/cache@v4 bundles) in a job's step environment.
//
//   node cache.cjs save KEY PATH...                 prints {"cacheId": N}
//   node cache.cjs restore KEY RESTORE-KEYS PATH... prints {"matchedKey": "..."} (null on a miss);
//                                                   RESTORE-KEYS is comma-separated, or "-"
//
// The client picks its protocol itself: v2 (twirp at ACTIONS_RESULTS_URL) when
// ACTIONS_CACHE_SERVICE_V2 is set and it takes the server for GitHub's, else v1 (REST at
// ACTIONS_CACHE_URL). As with artifact.cjs, `--patched` shows its isGhes() test a GitHub
// host, as act_runner's bundle edit does; without it a Gitea server gets v1.
'use strict'

async function main(argv) {
  const patched = argv.includes('--patched')
  const [command, key, ...rest] = argv.filter(a => a !== '--patched')
  if (patched) process.env.GITHUB_SERVER_URL = 'https://github.com'
  const cache = require('@actions/cache')
  if (command === 'save') return {cacheId: await cache.saveCache(rest, key)}
  if (command === 'restore') {
    const [restoreKeys, ...paths] = rest
    const keys = restoreKeys === '-' ? [] : restoreKeys.split(',')
    return {matchedKey: (await cache.restoreCache(paths, key, keys)) || null}
  }
  throw new Error(`usage: cache.cjs save|restore ... (got ${argv.join(' ')})`)
}

main(process.argv.slice(2)).then(
  result => console.log(JSON.stringify(result)),
  error => {
    console.error(`cache client failed: ${error && error.stack ? error.stack : error}`)
    process.exit(1)
  }
)
