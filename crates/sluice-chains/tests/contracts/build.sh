#!/usr/bin/env bash
# Compiles Tokens.sol into the committed compiled/*.json (abi + bytecode), so tests need no
# solc at run time. Run from this directory after changing Tokens.sol:
#   ./build.sh
# Uses solc-js 0.8.28 from npm, cached under ~/.cache/sluice-tools/solc.
set -euo pipefail
cd "$(dirname "$0")"
SOLC_DIR="${HOME}/.cache/sluice-tools/solc"
if [ ! -x "$SOLC_DIR/node_modules/.bin/solcjs" ]; then
  mkdir -p "$SOLC_DIR"
  (cd "$SOLC_DIR" && npm install --no-audit --no-fund solc@0.8.28 >/dev/null)
fi
out="$(mktemp -d)"
"$SOLC_DIR/node_modules/.bin/solcjs" --optimize --bin --abi --base-path . -o "$out" Tokens.sol
mkdir -p compiled
for contract in TestToken BareToken TestNft TestMulti TestPair TestPoolV3; do
  node -e '
    const fs = require("fs");
    const [abi, bin, dest] = process.argv.slice(1);
    fs.writeFileSync(dest, JSON.stringify({
      abi: JSON.parse(fs.readFileSync(abi, "utf8")),
      bytecode: "0x" + fs.readFileSync(bin, "utf8").trim(),
    }, null, 1) + "\n");
  ' "$out/Tokens_sol_${contract}.abi" "$out/Tokens_sol_${contract}.bin" "compiled/${contract}.json"
done
rm -rf "$out"
echo "compiled: $(ls compiled)"
