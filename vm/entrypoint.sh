#!/bin/sh
# dynrunner-vm-entrypoint: the entrypoint of the dynrunner VM image (one sandbox = one job).
#
# 1. Wait for the controller's delivery: a directory $DYNRUNNER_DELIVERY_DIR holding
#    `assignment.pb` and, when the job has a workload identity, `join-token` (and the SPIRE
#    trust bundle `bundle.pem`, unless the image has one). The controller
#    writes both through execd's file API into "$DYNRUNNER_DELIVERY_DIR.partial" and then
#    renames that directory, so the directory appears complete or not at all, and only once
#    (execd refuses a rename onto an existing directory). Neither secret is ever in the
#    sandbox's env or metadata.
# 2. With a join token: render the SPIRE agent's config, start the agent (it attests with the
#    token, which SPIRE accepts once), wait for its Workload API socket, delete the token. The
#    agent logs to $DYNRUNNER_SPIRE_AGENT_LOG: its lines up to attestation are copied to the
#    console; when it does not come up, its last lines go there (and so to the job log), and a
#    refused token fails at once.
# 3. Export `env` from the delivery if there is one (AWS_* S3 credentials for the artifact
#    store), delete it, and run the executor on the assignment, as $DYNRUNNER_EXECUTOR_USER
#    when running as root, keeping the task state Gitea last accepted in $DYNRUNNER_STATE_FILE
#    (the controller reads it through execd when it ends a job whose VM still runs); exit with
#    its status (the sandbox then ends Terminated or Failed). When that status is not 0 (the
#    executor did not finalize), first print that file on the console as one line,
#    `dynrunner-accepted-state: <base64>`, for the controller to read after the VM ended.
#
# Its own failures have exit statuses the executor never uses (0, 1, 3, 128+N), so the
# controller's diagnosis tells them apart: 66 nothing (or no assignment) was delivered, 69 the
# SPIRE agent did not come up (sysexits' EX_NOINPUT and EX_UNAVAILABLE).
#
# Plain POSIX sh: the OpenSandbox double runs this same script in tests, with the agent
# command pointed at the SPIRE agent double.
set -eu

EXIT_NOT_DELIVERED=66
EXIT_NO_AGENT=69

delivery=${DYNRUNNER_DELIVERY_DIR:-/run/dynrunner/delivery}
delivery_timeout=${DYNRUNNER_DELIVERY_TIMEOUT_SECONDS:-600}
agent_command=${DYNRUNNER_SPIRE_AGENT_COMMAND:-spire-agent run}
agent_template=${DYNRUNNER_SPIRE_AGENT_CONFIG_TEMPLATE:-/etc/dynrunner/spire-agent.conf.template}
agent_config=${DYNRUNNER_SPIRE_AGENT_CONFIG:-/run/dynrunner/spire-agent.conf}
agent_socket=${SPIFFE_AGENT_SOCKET:-/run/spire/agent/public/api.sock}
agent_timeout=${DYNRUNNER_SPIRE_AGENT_TIMEOUT_SECONDS:-120}
agent_log=${DYNRUNNER_SPIRE_AGENT_LOG:-${agent_config%.conf}.log}
executor=${DYNRUNNER_EXECUTOR_COMMAND:-dynrunner-executor}
executor_user=${DYNRUNNER_EXECUTOR_USER-runner}
state_file=${DYNRUNNER_STATE_FILE:-/run/dynrunner/reported/accepted-state.pb}
state_max=${DYNRUNNER_STATE_CONSOLE_MAX_BYTES:-12000} # base64 within one 16 KiB log line
case $state_max in '' | *[!0-9]*) state_max=12000 ;; esac # arithmetic on it must not fail

say() { printf 'dynrunner-vm-entrypoint: %s\n' "$*" >&2; }

# wait_for TEST PATH SECONDS: poll every 0.1 s until `test TEST PATH` holds.
wait_for() {
    tries=$(($3 * 10))
    while ! test "$1" "$2"; do
        tries=$((tries - 1))
        [ "$tries" -gt 0 ] || return 1
        sleep 0.1
    done
}

if ! wait_for -d "$delivery" "$delivery_timeout"; then
    say "no assignment was delivered to $delivery within ${delivery_timeout}s"
    exit "$EXIT_NOT_DELIVERED"
fi
assignment=$delivery/assignment.pb
[ -f "$assignment" ] || { say "the delivery has no assignment.pb"; exit "$EXIT_NOT_DELIVERED"; }

# wait_for_agent: until the agent's Workload API socket is open. A refused join token is final
# (SPIRE deletes a token on first use), but the real spire-agent retries it forever: its log
# says so at once, and waiting out the timeout would only delay the job's failure.
wait_for_agent() {
    tries=$((agent_timeout * 10))
    while ! test -S "$agent_socket"; do
        if grep -q -E 'join token (does not exist|has already been used|expired)' "$agent_log" 2>/dev/null; then
            agent_failure="the SPIRE server refused the join token (see the agent's lines above)"
            return 1
        fi
        if ! kill -0 "$agent_pid" 2>/dev/null; then
            agent_failure="the SPIRE agent exited before it opened $agent_socket"
            return 1
        fi
        tries=$((tries - 1))
        if [ "$tries" -le 0 ]; then
            agent_failure="the SPIRE agent did not open $agent_socket within ${agent_timeout}s"
            return 1
        fi
        sleep 0.1
    done
}

agent_pid=
agent_failure=
stop_agent() {
    if [ -n "$agent_pid" ]; then
        kill "$agent_pid" 2>/dev/null || true
        wait "$agent_pid" 2>/dev/null || true # its status is not the job's
    fi
    agent_pid=
}

if [ -f "$delivery/join-token" ]; then
    bundle=${SPIRE_TRUST_BUNDLE_PATH:-/etc/dynrunner/spire-bundle.pem}
    [ -f "$delivery/bundle.pem" ] && bundle=$delivery/bundle.pem
    mkdir -p "$(dirname "$agent_config")" "$(dirname "$agent_socket")" "$(dirname "$agent_log")"
    sed -e "s|@JOIN_TOKEN_FILE@|$delivery/join-token|g" \
        -e "s|@SOCKET_PATH@|$agent_socket|g" \
        -e "s|@SERVER_ADDRESS@|${SPIRE_SERVER_ADDRESS:-spire-server}|g" \
        -e "s|@SERVER_PORT@|${SPIRE_SERVER_PORT:-8081}|g" \
        -e "s|@TRUST_DOMAIN@|${SPIRE_TRUST_DOMAIN:-example.org}|g" \
        -e "s|@TRUST_BUNDLE_PATH@|$bundle|g" \
        -e "s|@DATA_DIR@|${SPIRE_AGENT_DATA_DIR:-/run/spire/agent/data}|g" \
        "$agent_template" >"$agent_config"
    # shellcheck disable=SC2086 # the command is a word list by design
    $agent_command -config "$agent_config" >"$agent_log" 2>&1 &
    agent_pid=$!
    trap 'stop_agent' EXIT
    if ! wait_for_agent; then
        tail -n 20 "$agent_log" >&2 || true
        say "$agent_failure"
        exit "$EXIT_NO_AGENT"
    fi
    cat "$agent_log" >&2 || true
    say "the SPIRE agent attested; its further lines go to $agent_log"
    rm -f "$delivery/join-token"
fi

mkdir -p "$(dirname "$state_file")"
export DYNRUNNER_STATE_FILE="$state_file"

# The executor's own environment from the delivery (S3 credentials for the artifact store):
# exported for it alone, then the file goes, as the token does.
if [ -f "$delivery/env" ]; then
    while IFS= read -r line; do
        name=${line%%=*}
        case $name in
        AWS_*[!A-Z0-9_]* | "$line") say "ignoring a malformed line of $delivery/env" ;;
        AWS_?*) export "$name=${line#*=}" ;;
        *) say "ignoring $name in $delivery/env" ;;
        esac
    done <"$delivery/env"
    rm -f "$delivery/env"
fi

run_as=
if [ -n "$executor_user" ] && [ "$(id -u)" = 0 ]; then
    chown "$executor_user" "$(dirname "$state_file")"
    chown "$executor_user" "$assignment"
    chmod 0400 "$assignment"
    home=$(getent passwd "$executor_user" | cut -d: -f6)
    run_as="env HOME=${home:-/} USER=$executor_user LOGNAME=$executor_user"
    run_as="$run_as setpriv --reuid=$executor_user --regid=$(id -g "$executor_user") --init-groups --"
fi

# shellcheck disable=SC2086
$run_as $executor run --assignment "$assignment" &
executor_pid=$!
trap 'kill -TERM "$executor_pid" 2>/dev/null' TERM INT
status=0
wait "$executor_pid" || status=$?
# A TERM interrupts the first wait; wait again for the executor's own exit.
if kill -0 "$executor_pid" 2>/dev/null; then
    wait "$executor_pid" || status=$?
fi
stop_agent
# The executor ended without finalizing its task (killed, out of memory, failed): the VM ends
# now and execd with it, so the task state Gitea last accepted goes on the console, which the
# controller reads once the VM has ended. Read as the executor's user (the job's own file: it
# may point it at a file only root could read), at most $state_max bytes.
if [ "$status" -ne 0 ] && [ -f "$state_file" ]; then
    # shellcheck disable=SC2086
    size=$($run_as head -c "$((state_max + 1))" "$state_file" | wc -c) || size=0
    if [ "$size" -gt "$state_max" ]; then
        say "the accepted task state is over ${state_max} bytes: not printed (every step is cancelled)"
    elif [ "$size" -gt 0 ]; then
        # shellcheck disable=SC2086
        printf 'dynrunner-accepted-state: %s\n' "$($run_as head -c "$state_max" "$state_file" | base64 | tr -d '\n')"
    fi
fi
exit "$status"
