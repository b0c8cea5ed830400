#!/bin/sh
# /usr/local/bin/dynrunner-executor in the executor image. When it starts as PID 1 (the image's
# own entrypoint, or a Pod whose `command:` names dynrunner-executor and so replaces the
# entrypoint), tini becomes PID 1 instead: steps leave orphans behind (daemons, background
# jobs) and only an init reaps them; without one they stay zombies. Otherwise (a step calling
# `dynrunner-executor artifact …`) it is the executor itself.
if [ "$$" = 1 ]; then
  exec tini -- /opt/dynrunner/venv/bin/dynrunner-executor "$@"
fi
exec /opt/dynrunner/venv/bin/dynrunner-executor "$@"
