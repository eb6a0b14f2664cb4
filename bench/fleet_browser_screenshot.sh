#!/usr/bin/env bash
# The fleet in a browser (issue 32 item 11): serve the demo lab's console with `cetlab-console --demo --serve` and take
# a screenshot of it in headless Chromium (Debian: apt-get install -y chromium). Not part of the suite: the suite opens
# the page's websocket itself (tests/e2e/tui/test_serve.py).
#   bench/fleet_browser_screenshot.sh [OUT.png]   (default screenshots/fleet-browser.png; PORT=8471, SIZE=1400,860)
set -euo pipefail
out=$(realpath -m "${1:-screenshots/fleet-browser.png}")  # before the cd: a path given is the caller's
cd "$(dirname "$0")/.."
port=${PORT:-8471}
size=${SIZE:-1400,860}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "no Chromium here: apt-get install -y chromium" >&2; exit 3; }
log=$(mktemp)
python -m console.tui.app --demo --serve --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
# the server says its URL once the demo's agents listen (up to a minute on a loaded machine)
for _ in $(seq 600); do
  grep -q "served at" "$log" && break
  kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.2
done
grep -q "served at" "$log" || { cat "$log" >&2; exit 1; }
# the capture waits for the fleet's header to count every machine online and every simulated GPU of the demo sampled
shown=$(python -c "from agents.wire.lab.model import load_lab; from console.lab.demo import bundled_lab
lab = load_lab(bundled_lab()); n = len(lab.machines); gpus = sum(len(getattr(m.gpus, 'sim', None) or []) for m in lab.machines)
print(f'{n}/{n} machines online[^0-9]+{gpus} GPUs')")
python bench/fleet_browser_screenshot.py "$browser" "http://127.0.0.1:$port/?fontsize=${FONT:-14}" "$out" "${size%,*}" "${size#*,}" "$shown"
