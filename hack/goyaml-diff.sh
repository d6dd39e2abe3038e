#!/usr/bin/env bash
# Differential check of bitpool's go-yaml-compatible writer (src/render/goyaml.rs) against
# sigs.k8s.io/yaml on random documents. Needs Go and python3; not part of hack/test.sh.
# Usage: hack/goyaml-diff.sh [seed] [documents]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${TMPDIR:-/tmp}/bitpool-goyaml-diff"
mkdir -p "$out"
(cd hack/goyaml-diff && go build -o "$out/go-writer" .)
cargo build -q --example goyaml
python3 - "$out/go-writer" target/debug/examples/goyaml "${1:-1}" "${2:-1500}" <<'PY'
import json, random, subprocess, sys
go, rust, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
random.seed(seed)
# U+0085 is left out: Go's JSON-to-YAML round trip folds it into a space before writing.
alphabet = list("abyYnNtT01239:-_.,#'\"@ ?!&*[]{}|>%`\t\n~+eExXo/\\é") + ["\u00a0", "\u2028", "\U0001F600", "\x01"]
failures = 0
for _ in range(count):
    doc = {}
    for _ in range(10):
        s = "".join(random.choice(alphabet) for _ in range(random.randint(0, 12)))
        if random.random() < 0.1:
            s = " ".join("word%d" % random.randint(0, 999) for _ in range(random.randint(10, 30)))
        # Keys without digits: go-yaml's key order is not a total order on digit runs.
        key = "".join(random.choice("aZb_-xy.") for _ in range(random.randint(1, 5)))
        doc[key] = s if random.random() < 0.8 else [s, {"k": s}]
    text = json.dumps(doc).encode()
    want = subprocess.run([go], input=text, capture_output=True, check=True).stdout
    got = subprocess.run([rust], input=text, capture_output=True, check=True).stdout
    if want != got:
        failures += 1
        print("differs for", text.decode())
        if failures > 5:
            break
print(f"{count} documents, {failures} differing")
sys.exit(1 if failures else 0)
PY
