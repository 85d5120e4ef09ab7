#!/usr/bin/env python3
"""Creates realistic resources on a running `sluice serve` for scripts/fuzz-api and writes
the schemathesis config that hands their ids to every operation as path parameters.

Usage: fuzz-api-fixtures.py BASE_URL OPERATOR_KEY CONFIG_OUT STATEFUL_CONFIG_OUT

CONFIG_OUT pins the path parameters to the resources below, for the phases that test one
operation at a time. STATEFUL_CONFIG_OUT pins none: the stateful phase chains operations
through the resources it creates itself (following the links from their creation), and
schemathesis 4.32 applies per-operation parameters of one operation to others of the same
path in that phase.

Resources (all owned by the bootstrap operator):
  * a pipeline on base.erc20_token_transfer with a set filter (uid tf-fuzz, a few values)
    and a script that fails on some records (uid tf-fuzz-script), and a managed sink (uid
    sk-fuzz), deployed, with records delivered to the sink and dead letters;
  * a dataset with entries (for the operations that read or add to it);
  * for each operation that destroys or replaces what the others read (deleting a pipeline
    or a dataset, tearing a deployment down, replacing a pipeline or its transforms), a
    pipeline or dataset of its own, so the run keeps reaching the shared resources.

Besides the ids, the config sets, per operation, the statuses the positive-data check
accepts beyond its defaults, each with the reason (see docs/api.md, "Fuzzing"):
  * 416 on the sink and dead-letter reads: an offset or Last-Event-ID past the end of the
    topic is well formed, and whether it is in range depends on what the topic holds;
  * 422 where the server checks what JSON Schema cannot say: scripts that must compile,
    filter expressions that must name a field of the source entity's records, chain and
    entity that must be a catalog pair, user and team ids that must exist, NDJSON lines
    with the entity's key and time fields, price ranges whose start must precede the end
    and lie within retention, backfill windows whose start must precede the end, filter
    columns the table must have, sink secrets that must exist, the sinks of notification
    destinations (checked as a pipeline's sink: URLs the sink can use, secrets that exist),
    and a set-filter membership check's `at`, an RFC 3339 time or a block number that must
    lie within the set history.
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


def pipeline_body(name):
    return {
        "name": name,
        "description": "USDC transfers on Base, for the fuzzer",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{
                "type": "redis_set_filter",
                "uid": "tf-fuzz",
                "filter_expr": "root = this.token_address",
                "set_values": [TOKEN, "0x4200000000000000000000000000000000000006"],
            }, {
                # Fails on some records, so the pipeline has dead letters (and the long
                # polls of `…/dead-letters` answer at once instead of waiting).
                "type": "v8",
                "uid": "tf-fuzz-script",
                "script": "function transform(r) {\n"
                          "  if (r.log_index === 9) { throw new Error('fuzz: poison record'); }\n"
                          "  return r;\n}\n",
            }],
            "sinks": [{"type": "kafka", "uid": "sk-fuzz", "name": "fuzz-transfers"}],
        },
    }


# Operations that destroy or replace shared resources, each given a resource of its own.
OWN_PIPELINE = [
    ("DELETE", "/api/v1/beam/{config_id}"),
    ("PUT", "/api/v1/beam/{config_id}"),
    ("POST", "/api/v1/beam/{config_id}/teardown"),
    ("PUT", "/api/v1/beam/{config_id}/transforms"),
    ("PATCH", "/api/v1/beam/{config_id}/transforms/{transform_uid}"),
    ("PUT", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
    ("DELETE", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
]
OWN_DATASET = [
    ("DELETE", "/api/v1/beam/datasets/{dataset_id}/entries"),
]
# The dataset operations that read or add to the shared dataset. `DELETE …/{dataset_id}`
# is given no dataset: it deletes those the run creates itself (the stateful phase follows
# the link from their creation) and otherwise answers 404.
SHARED_DATASET = [
    ("GET", "/api/v1/beam/datasets/{dataset_id}/entries"),
    ("POST", "/api/v1/beam/datasets/{dataset_id}/entries"),
    ("GET", "/api/v1/beam/datasets/{dataset_id}/entries/check"),
]

# Extra statuses the positive-data check accepts, by operation (reasons in the docstring).
SEMANTIC_422 = [
    ("POST", "/api/v1/beam"),
    ("PUT", "/api/v1/beam/{config_id}"),
    ("PUT", "/api/v1/beam/{config_id}/transforms"),
    ("PATCH", "/api/v1/beam/{config_id}/transforms/{transform_uid}"),
    ("PUT", "/api/v1/beam/{config_id}/permissions"),
    ("POST", "/api/v1/streams/{chain}/{entity}/records"),
    ("POST", "/api/v1/developer/prices/history"),
    ("POST", "/api/v1/beam/backfills"),
    ("PUT", "/api/v1/notifications"),
    ("GET", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/check"),
]
OUT_OF_RANGE_416 = [
    ("GET", "/api/v1/beam/{config_id}/dead-letters"),
    ("GET", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records"),
    ("GET", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream"),
]
# The live tail never ends by itself: schemathesis reads it until 20 events or the request
# timeout, so its window is short (records already in the sink arrive at once).
STREAM_READ_SECONDS = {("GET", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream"): 2}
POSITIVE_DEFAULT = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]


def toml(value):
    return json.dumps(value)


def render(key, parameters, overrides):
    """The schemathesis config: the key, the pinned parameters and, per operation, its own
    resources and the extra statuses of the positive-data check."""
    lines = [
        "# Written by scripts/fuzz-api-fixtures.py for one run of scripts/fuzz-api.",
        "[headers]",
        f"X-API-Key = {toml(key)}",
    ]
    if parameters:
        lines += ["", "[parameters]"]
        lines += [f"{toml(name)} = {toml(value)}" for name, value in parameters.items()]
    extra_statuses = {}
    for operation in SEMANTIC_422:
        extra_statuses.setdefault(operation, []).append("422")
    for operation in OUT_OF_RANGE_416:
        extra_statuses.setdefault(operation, []).append("416")
    for method, path in sorted(set(overrides) | set(extra_statuses) | set(STREAM_READ_SECONDS)):
        # `include-name` (the label): schemathesis 4.32 ignores `include-method` when it
        # is combined with a path filter, and would give one operation's settings to every
        # operation of its path.
        lines += ["", "[[operations]]", f"include-name = {toml(method + ' ' + path)}"]
        if (method, path) in overrides:
            params = {**parameters, **overrides[(method, path)]}
            lines.append("parameters = { " + ", ".join(
                f"{toml(k)} = {toml(v)}" for k, v in params.items()) + " }")
        if (method, path) in STREAM_READ_SECONDS:
            lines.append(f"request-timeout = {STREAM_READ_SECONDS[(method, path)]}")
        if (method, path) in extra_statuses:
            statuses = POSITIVE_DEFAULT + extra_statuses[(method, path)]
            lines.append(f"checks.positive_data_acceptance.expected-statuses = {toml(statuses)}")
    return "\n".join(lines) + "\n"


def main():
    base, key, out, stateful_out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    _, pipeline = call(base, key, "POST", "/api/v1/beam", pipeline_body("fuzz-usdc"))
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

    own_pipelines = {}
    for index, (method, path) in enumerate(OWN_PIPELINE):
        _, own = call(base, key, "POST", "/api/v1/beam", pipeline_body(f"fuzz-own-{index}"))
        call(base, key, "POST", f"/api/v1/beam/{own['id']}/deploy")
        own_pipelines[(method, path)] = own["id"]
    own_datasets = {}
    for index, (method, path) in enumerate(OWN_DATASET):
        _, own = call(base, key, "POST", "/api/v1/beam/datasets", {"name": f"fuzz-own-{index}"})
        call(base, key, "POST", f"/api/v1/beam/datasets/{own['id']}/entries",
             {"values": ["0xabc", "0xdef"]})
        own_datasets[(method, path)] = own["id"]

    parameters = {
        "path.config_id": config_id,
        "path.transform_uid": "tf-fuzz",
        "path.sink_uid": "sk-fuzz",
        "path.chain": "base",
        "path.entity": "erc20_token_transfer",
    }
    overrides = {}
    for (method, path), own_id in own_pipelines.items():
        overrides.setdefault((method, path), {})["path.config_id"] = own_id
    for (method, path), own_id in own_datasets.items():
        overrides.setdefault((method, path), {})["path.dataset_id"] = own_id
    for method, path in SHARED_DATASET:
        overrides.setdefault((method, path), {})["path.dataset_id"] = dataset_id
    with open(out, "w", encoding="utf-8") as config:
        config.write(render(key, parameters, overrides))
    with open(stateful_out, "w", encoding="utf-8") as config:
        config.write(render(key, {}, {}))
    print(f"pipeline {config_id} (deployed, records delivered), dataset {dataset_id}")


if __name__ == "__main__":
    main()
