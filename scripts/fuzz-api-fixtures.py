#!/usr/bin/env python3
"""Creates realistic resources on a running `sluice serve` for scripts/fuzz-api and writes
the schemathesis config that hands their ids to every operation as path parameters.

Usage: fuzz-api-fixtures.py BASE_URL OPERATOR_KEY CONFIG_OUT

Resources (all owned by the bootstrap operator):
  * a pipeline on base.erc20_token_transfer with a set filter (uid tf-fuzz, a few values)
    and a managed sink (uid sk-fuzz), deployed, with records delivered to the sink;
  * a dataset with entries.
"""

import json
import sys
import time
import urllib.error
import urllib.request

TOKEN = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"


def call(base, key, method, path, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("X-API-Key", key)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as error:
        sys.exit(f"fixtures: {method} {path} answered {error.code}: {error.read().decode()}")


def transfer(n):
    return {
        "block_number": 1000 + n,
        "block_timestamp": "2026-11-21T12:00:00Z",
        "transaction_hash": "0x%064x" % n,
        "log_index": n % 10,
        "token_address": TOKEN,
        "from_address": "0x" + "11" * 20,
        "to_address": "0x" + "22" * 20,
        "amount_str": "1.5",
    }


def main():
    base, key, out = sys.argv[1], sys.argv[2], sys.argv[3]
    _, pipeline = call(base, key, "POST", "/api/v1/beam", {
        "name": "fuzz-usdc",
        "description": "USDC transfers on Base, for the fuzzer",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{
                "type": "redis_set_filter",
                "uid": "tf-fuzz",
                "filter_expr": "root = this.token_address",
                "set_values": [TOKEN, "0x4200000000000000000000000000000000000006"],
            }],
            "sinks": [{"type": "kafka", "uid": "sk-fuzz", "name": "fuzz-transfers"}],
        },
    })
    config_id = pipeline["id"]
    call(base, key, "POST", f"/api/v1/beam/{config_id}/deploy")
    ndjson = "".join(json.dumps(transfer(n)) + "\n" for n in range(1, 21)).encode()
    call(base, key, "POST", "/api/v1/streams/base/erc20_token_transfer/records", raw=ndjson)
    records = f"/api/v1/beam/{config_id}/sinks/sk-fuzz/records?wait_ms=1000"
    deadline = time.monotonic() + 60
    while True:
        _, page = call(base, key, "GET", records)
        if page["records"]:
            break
        if time.monotonic() > deadline:
            sys.exit("fixtures: no record reached the sink within 60 s")
    _, dataset = call(base, key, "POST", "/api/v1/beam/datasets", {"name": "fuzz-watchlist"})
    dataset_id = dataset["id"]
    call(base, key, "POST", f"/api/v1/beam/datasets/{dataset_id}/entries",
         {"values": [TOKEN, "0xabc", "vitalik.eth"]})

    parameters = {
        "path.config_id": config_id,
        "path.transform_uid": "tf-fuzz",
        "path.sink_uid": "sk-fuzz",
        "path.dataset_id": dataset_id,
        "path.chain": "base",
        "path.entity": "erc20_token_transfer",
    }
    lines = [
        "# Written by scripts/fuzz-api-fixtures.py for one run of scripts/fuzz-api.",
        "[headers]",
        f"X-API-Key = {json.dumps(key)}",
        "",
        "[parameters]",
    ]
    lines += [f"{json.dumps(name)} = {json.dumps(value)}" for name, value in parameters.items()]
    with open(out, "w", encoding="utf-8") as config:
        config.write("\n".join(lines) + "\n")
    print(f"pipeline {config_id} (deployed, records delivered), dataset {dataset_id}")


if __name__ == "__main__":
    main()
