#!/bin/sh
# A plain Debian base image made with debootstrap, for building the images where an official
# base image cannot be pulled (no registry access, or a policy of building from Debian's own
# packages):
#
#   images/debootstrap-base.sh TAG            # e.g. localhost/dynrunner/base:bookworm
#
# Environment:
#   SUITE            Debian release (bookworm)
#   DEBIAN_MIRROR    the mirror; default: the first Debian mirror of this machine's apt sources
#   ENGINE           container engine command with its global flags (podman)
#   CACHE_DIR        if set, the root file system is kept there as <suite>-minbase-<arch>.tar and
#                    reused while younger than CACHE_MAX_AGE_DAYS (7); without it, or when it is
#                    stale or unreadable, debootstrap runs
#
# The file system is trimmed like Debian's slim images: no apt lists or package cache, and
# documentation, manual pages and translations are neither kept nor installed later.
set -eu

tag=${1:?usage: debootstrap-base.sh TAG}
suite=${SUITE:-bookworm}
engine=${ENGINE:-podman}
arch=$(dpkg --print-architecture)

mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  # deb822 sources: the URIs of the first enabled `deb` stanza whose suites include a release
  # (a suite without a dash: not -security, -updates or -backports).
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          split($i, kv, ":[ \t]*")
          key = tolower(kv[1]); value = substr($i, length(kv[1]) + 2); sub(/^[ \t]+/, "", value)
          if (key == "types") types = value
          else if (key == "uris") uris = value
          else if (key == "suites") suites = value
          else if (key == "enabled") enabled = tolower(value)
        }
        if (enabled == "no" || (" " types " ") !~ / deb /) next
        n = split(suites, s, /[ \t]+/)
        for (j = 1; j <= n; j++) if (s[j] != "" && s[j] !~ /-/) { split(uris, u, /[ \t]+/); print u[1]; exit }
      }' "$f"
  done | head -n 1 | grep . && return
  # One-line sources: deb [options] URI SUITE COMPONENTS...
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | sed -e 's/#.*//' -e 's/\[[^]]*\]//' \
    | awk '$1 == "deb" && $3 !~ /-/ { print $2; exit }' | grep . && return
  echo "debootstrap-base.sh: no Debian mirror in this machine's apt sources; set DEBIAN_MIRROR" >&2
  return 1
}

fresh() {  # fresh FILE: it exists and is younger than CACHE_MAX_AGE_DAYS
  [ -s "$1" ] && [ -n "$(find "$1" -mtime -"${CACHE_MAX_AGE_DAYS:-7}" 2>/dev/null)" ]
}

import() {  # import TARBALL
  $engine import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$1" "$tag" >/dev/null
}

cached=${CACHE_DIR:+$CACHE_DIR/$suite-minbase-$arch.tar}
if [ -n "$cached" ] && fresh "$cached" && import "$cached"; then
  echo "debootstrap-base.sh: $tag from the cached $cached"
  exit 0
fi

url=$(mirror)
work=$(mktemp -d "${TMPDIR:-/tmp}/debootstrap-base.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
root=$work/root
debootstrap --variant=minbase "$suite" "$root" "$url" >"$work/debootstrap.log" 2>&1 || {
  tail -n 20 "$work/debootstrap.log" >&2
  echo "debootstrap-base.sh: debootstrap $suite from $url failed" >&2
  exit 1
}
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$root/etc/apt/apt.conf.d/90no-recommends"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*.log
find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
tar -C "$root" --numeric-owner -cf "$work/root.tar" .
import "$work/root.tar"
if [ -n "$cached" ]; then
  mkdir -p "$CACHE_DIR" && mv "$work/root.tar" "$cached.partial" && mv "$cached.partial" "$cached" || true
fi
echo "debootstrap-base.sh: $tag from debootstrap $suite ($arch)"
