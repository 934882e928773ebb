#!/usr/bin/env bash
# test_replicas.sh - docs/deploy/haproxy.cfg in front of two real pagellm servers (CPU, bundled
# stories260K): the file is valid; requests whose prompts share their first 256 bytes reach
# the same replica (completions and chat), different prefixes spread over both; a replica
# ended with SIGTERM stops getting requests and the other serves them all. Which replica
# served a request is read from its pagellm:request_success_total. Run by `ninja test` from
# the repository root; skipped (cmocka's SKIPPED summary) without haproxy or curl. Output ends
# with cmocka's summary lines, which tests/run_tests.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/support/script_test.sh

bin=${PAGELLM_BIN:-build/pagellm}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/pagellm-replicas.XXXXXX")
pids=()
cleanup() {
    [[ -f $scratch/haproxy.pid ]] && kill "$(cat "$scratch/haproxy.pid")" 2>/dev/null
    for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null; done
    rm -rf "$scratch"
}
trap cleanup EXIT
cases=(replicas_config_is_valid replicas_same_prefix_same_replica replicas_prefixes_spread
       replicas_chat_same_system_prompt_same_replica replicas_stopped_replica_gets_none)

st_begin replicas "${cases[@]}"
why=""
if ! command -v haproxy >/dev/null; then
    why="haproxy not found (apt-get install haproxy)"
elif ! command -v curl >/dev/null; then
    why="curl not found"
elif [[ ! -x $bin ]]; then
    why="no $bin (run ninja first)"
fi
[[ -n $why ]] && st_skip_all "$why"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
front=$(free_port)
ports=($(free_port) $(free_port))
for i in 0 1; do
    "$bin" serve --device cpu --cpu-threads 1 --host 127.0.0.1 --port "${ports[$i]}" \
        --model models/stories260K --chat-template chatml >"$scratch/replica$i.log" 2>&1 &
    pids+=($!)
done
sed -e "s/127.0.0.1:8000/127.0.0.1:$front/" -e "s/127.0.0.1:8001/127.0.0.1:${ports[0]}/" \
    -e "s/127.0.0.1:8002/127.0.0.1:${ports[1]}/" -e "s/inter 2s/inter 300ms/" \
    docs/deploy/haproxy.cfg >"$scratch/haproxy.cfg"

st_run replicas_config_is_valid
if haproxy -c -f "$scratch/haproxy.cfg" >"$scratch/check.log" 2>&1; then
    st_ok replicas_config_is_valid
else
    st_fail replicas_config_is_valid "$(tail -3 "$scratch/check.log")"
fi

# Both replicas answer /health, then HAProxy starts (and sees them up at its first checks).
for t in $(seq 200); do
    up=0
    for p in "${ports[@]}"; do curl -sf "http://127.0.0.1:$p/health" >/dev/null && up=$((up + 1)); done
    [[ $up == 2 ]] && break
    sleep 0.1
done
haproxy -f "$scratch/haproxy.cfg" -D -p "$scratch/haproxy.pid" >"$scratch/haproxy.log" 2>&1
sleep 1

served() { # total successful requests of replica $1
    curl -sf "http://127.0.0.1:${ports[$1]}/metrics" |
        awk '/^pagellm:request_success_total/ { s += $NF } END { print s + 0 }'
}
# post PATH BODY: send it through HAProxy; prints the replica that served it (0, 1), or "x"
post() {
    local before0 before1 code
    before0=$(served 0) before1=$(served 1)
    code=$(curl -s -o "$scratch/body.json" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d "$2" "http://127.0.0.1:$front$1")
    if [[ $code != 200 ]]; then
        echo x
        return
    fi
    if [[ $(served 0) != "$before0" ]]; then echo 0; elif [[ $(served 1) != "$before1" ]]; then echo 1; else echo x; fi
}
preamble() { # a 330-byte prompt start of its own for each number
    printf 'Story %02d. ' "$1"
    for _ in $(seq 40); do printf 'Lily %02d ' "$1"; done
}
completion() { printf '{"prompt": "%s %s", "max_tokens": 4, "temperature": 0}' "$(preamble "$1")" "$2"; }

st_run replicas_same_prefix_same_replica
declare -A home
bad=""
for g in $(seq 12); do
    a=$(post /v1/completions "$(completion "$g" "Tom went to the park.")")
    b=$(post /v1/completions "$(completion "$g" "The cat sat on the mat.")")
    home[$g]=$a
    [[ $a == x || $a != "$b" ]] && bad+=" prefix $g: $a then $b;"
done
if [[ -z $bad ]]; then st_ok replicas_same_prefix_same_replica; else st_fail replicas_same_prefix_same_replica "$bad"; fi

st_run replicas_prefixes_spread
on0=0
for g in $(seq 12); do [[ ${home[$g]} == 0 ]] && on0=$((on0 + 1)); done
if ((on0 > 0 && on0 < 12)); then
    st_ok replicas_prefixes_spread
else
    st_fail replicas_prefixes_spread "all 12 prefixes on one replica (replica 0 got $on0)"
fi

st_run replicas_chat_same_system_prompt_same_replica
chat() {
    printf '{"messages": [{"role": "system", "content": "%s"}, {"role": "user", "content": "%s"}], "max_tokens": 4}' \
        "$(preamble "$1")" "$2"
}
bad=""
for g in 3 4 5 6; do
    a=$(post /v1/chat/completions "$(chat "$g" "Hello")")
    b=$(post /v1/chat/completions "$(chat "$g" "Tell me a story")")
    [[ $a == x || $a != "$b" ]] && bad+=" system prompt $g: $a then $b;"
done
if [[ -z $bad ]]; then st_ok replicas_chat_same_system_prompt_same_replica; else st_fail replicas_chat_same_system_prompt_same_replica "$bad"; fi

st_run replicas_stopped_replica_gets_none
kill -TERM "${pids[0]}"
wait "${pids[0]}" 2>/dev/null
sleep 2 # HAProxy's checks (every 300 ms, down after 2 failures) see it gone
bad=""
for g in $(seq 12); do
    r=$(post /v1/completions "$(completion "$g" "Tom went to the park.")")
    [[ $r != 1 ]] && bad+=" prefix $g: served by '$r';"
done
if [[ -z $bad ]]; then st_ok replicas_stopped_replica_gets_none; else st_fail replicas_stopped_replica_gets_none "$bad"; fi

st_end
