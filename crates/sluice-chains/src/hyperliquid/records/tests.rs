use super::*;
use crate::hyperliquid::files::sources;

fn at(file: &str) -> LineAt<'_> {
    LineAt { file, position: (1, 100), start: 0, index: 0 }
}

fn payloads(entity: &str, source: usize, line: &str, pairs: &mut Pairs) -> Vec<Value> {
    let source = sources(entity)[source];
    let built = build(entity, &source, line.as_bytes(), &at("f"), 808_750_000, pairs).unwrap();
    built.records.iter().map(|r| serde_json::from_slice::<Value>(r.value()).unwrap()).collect()
}

const TRADE: &str = r#"{"coin":"COMP","side":"B","time":"2024-07-26T08:26:25.899","px":"51.367","sz":"0.31","hash":"0xad8e0566e813bdf98176040e6d51bd011100efa789e89430cdf17964235f55d8","trade_dir_override":"Na","side_info":[{"user":"0xc64cc00b46101bd40aa1c3121195e85c0b0918d8","start_pos":"996.67","oid":12212201265,"twap_id":null,"cloid":null},{"user":"0x768484f7e2ebb675c57838366c02ae99ba2a9b08","start_pos":"-996.7","oid":12212198275,"twap_id":null,"cloid":null}]}"#;

#[test]
fn a_node_trade_keeps_decimal_strings_and_names_both_sides() {
    let records = payloads("trade", 1, TRADE, &mut Pairs::default());
    let record = &records[0];
    assert_eq!(record["node_file"], "f");
    assert_eq!(record["node_offset"], 100);
    assert!(record.get("block_number").is_none());
    let trade = &record["payload"];
    assert_eq!(trade["px"], "51.367");
    assert_eq!(trade["sz"], "0.31");
    assert_eq!(trade["time"], 1_721_982_385_899_i64);
    assert_eq!(trade["users"][0], "0xc64cc00b46101bd40aa1c3121195e85c0b0918d8");
    assert_eq!(trade["seller"]["oid"], 12_212_198_275_u64);
    assert_eq!(trade["buyer"]["startPosition"], "996.67");
    assert_eq!(trade["tid"], derived_tid(12_212_201_265, 12_212_198_275));
    assert!(trade.get("side_info").is_none());
}

#[test]
fn by_block_fills_carry_the_block_and_pair_into_trades() {
    let fill = |user: &str, side: &str, crossed: bool| {
        format!(
            r#"["{user}",{{"coin":"BTC","px":"104000.0","sz":"0.01","side":"{side}","time":1764059598111,"startPosition":"0.0","dir":"Open Long","closedPnl":"0.0","hash":"0xaa","oid":7,"crossed":{crossed},"fee":"0.4","tid":99,"feeToken":"USDC","twapId":null}}]"#
        )
    };
    let line = format!(
        r#"{{"local_time":"2025-11-25T08:33:18.508962742","block_time":"2025-11-25T08:33:18.111517886","block_number":807847463,"events":[{},{}]}}"#,
        fill("0x01", "B", false),
        fill("0x02", "A", true)
    );
    let fills = payloads("fill", 0, &line, &mut Pairs::default());
    assert_eq!(fills.len(), 2);
    assert_eq!(fills[0]["block_number"], 807_847_463);
    assert_eq!(fills[1]["payload"]["user"], "0x02");
    assert_eq!(fills[1]["payload"]["px"], "104000.0");
    let mut pairs = Pairs::default();
    let trades = payloads("trade", 2, &line, &mut pairs);
    assert_eq!(trades.len(), 1);
    let trade = &trades[0]["payload"];
    assert_eq!(trade["side"], "A", "the seller took liquidity");
    assert_eq!(trade["users"], json!(["0x01", "0x02"]));
    assert_eq!(trade["tid"], 99);
    assert_eq!(pairs.earliest_start(), None);
}

#[test]
fn replica_lines_are_blocks_numbered_after_their_file() {
    let line = r#"{"abci_block":{"time":"2025-11-26T04:53:40.123456789","round":1087330263,"parent_round":1087330262,"proposer":"0x5ac9","hardfork":{},"signed_action_bundles":[["0xb1",{"signed_actions":[{},{}],"broadcaster":"0x1"}],["0xb2",{"signed_actions":[{}]}]]},"resps":{"Full":[]}}"#;
    let blocks = payloads("block", 0, line, &mut Pairs::default());
    let block = &blocks[0]["payload"];
    assert_eq!(block["height"], 808_750_001);
    assert_eq!(block["numTxs"], 3);
    assert_eq!(block["hash"], Value::Null);
    assert_eq!(block["proposer"], "0x5ac9");
    assert_eq!(block["blockTime"], 1_764_132_820_123_i64);
}

#[test]
fn misc_events_lift_their_kind_and_account() {
    let line = r#"{"time":"2025-11-05T16:09:18.466557521","hash":"0x4a33","inner":{"LedgerUpdate":{"users":["0x025a","0x1e37"],"delta":{"type":"vaultWithdraw","user":"0x025a","requestedUsd":"7.203866"}}}}"#;
    let events = payloads("misc_event", 1, line, &mut Pairs::default());
    let event = &events[0]["payload"];
    assert_eq!(event["type"], "LedgerUpdate");
    assert_eq!(event["user"], "0x025a");
    assert_eq!(event["inner"]["LedgerUpdate"]["delta"]["requestedUsd"], "7.203866");
    let source = sources("misc_event")[1];
    let broken = r#"{"time":"x","hash":"0x1","inner":{"Funding":{}}}"#;
    assert!(
        build("misc_event", &source, broken.as_bytes(), &at("f"), 0, &mut Pairs::default())
            .is_err()
    );
}

/// What parsing the payload into a map and serialising the wrapped record writes.
fn via_map(entity: &str, block: Option<u64>, payload: Value) -> Vec<u8> {
    let Value::Object(payload) = payload else { panic!("not an object") };
    record(entity, &at("f"), block, payload).unwrap().value().to_vec()
}

#[test]
fn records_are_written_byte_for_byte_as_a_parsed_map_writes_them() {
    // Unsorted keys, a repeated key, escapes, floats, nested objects and arrays.
    let fields = r#"{"tid":99,"side":"B","time":1764059598111,"px":"1.5","oid":7,"coin":"A\u00e9\"x","sz":1.0e2,"crossed":false,"liq":{"z":[1,-0,2.50],"a":"\/"},"startPosition":"0.0","hash":"0xaa","sz":"0.25","cloid":null,"twapId":12345678901234567890,"user":"old"}"#;
    let line = format!(
        r#"{{"block_time":"2025-11-25T08:33:18.111517886","block_number":5,"events":[["0x\u0031",{fields}],["0x02",{}]]}}"#,
        fields
            .replace(r#""side":"B""#, r#""side":"A""#)
            .replace(r#""crossed":false"#, r#""crossed":true"#)
    );
    let parsed: Value = serde_json::from_str(&line).unwrap();
    let source = sources("fill")[0];
    let built =
        build("fill", &source, line.as_bytes(), &at("f"), 0, &mut Pairs::default()).unwrap();
    for (index, record) in built.records.iter().enumerate() {
        let event = &parsed["events"][index];
        let mut payload = event[1].clone();
        payload["user"] = event[0].clone();
        assert_eq!(record.value(), via_map("fill", Some(5), payload).as_slice());
    }
    let mut pairs = Pairs::default();
    let source = sources("trade")[2];
    let built = build("trade", &source, line.as_bytes(), &at("f"), 0, &mut pairs).unwrap();
    let (buyer, seller) = (&parsed["events"][0], &parsed["events"][1]);
    let info = |fill: &Value| {
        json!({"user": fill[0], "oid": fill[1]["oid"], "startPosition": fill[1]["startPosition"],
            "twapId": fill[1]["twapId"], "cloid": fill[1]["cloid"]})
    };
    let b = &buyer[1];
    let trade = json!({"coin": b["coin"], "px": b["px"], "sz": b["sz"], "time": b["time"],
        "hash": b["hash"], "tid": b["tid"], "side": "A", "users": [buyer[0], seller[0]],
        "buyer": info(buyer), "seller": info(seller)});
    assert_eq!(built.records[0].value(), via_map("trade", Some(5), trade).as_slice());
    assert_eq!(built.records[0].key(), "99");

    let order = r#"{"user":"0x03","status":"open","hash":null,"time":"2025-11-25T08:33:18.111","order":{"oid":42,"coin":"BTC","side":"B","limitPx":"1.0","sz":"2.0e0","children":[],"origSz":1e-7}}"#;
    let source = sources("order")[0];
    let line =
        format!(r#"{{"block_number":6,"block_time":"2025-11-25T08:33:18.1","events":[{order}]}}"#);
    let built =
        build("order", &source, line.as_bytes(), &at("f"), 0, &mut Pairs::default()).unwrap();
    let mut payload: Value = serde_json::from_str(order).unwrap();
    payload["time"] = json!(time_ms(&payload["time"]).unwrap());
    assert_eq!(built.records[0].value(), via_map("order", Some(6), payload).as_slice());
    assert_eq!(built.records[0].key(), "42:open:1764059598111");
}

#[test]
fn node_times_read_directly_are_what_chrono_reads() {
    let chrono_ms = |text: &str| {
        chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
            .ok()
            .map(|t| t.and_utc().timestamp_millis())
    };
    for text in [
        "2025-11-25T08:33:18.508962742",
        "2025-11-25T08:33:18.1",
        "2025-11-25T08:33:18.999",
        "2025-11-25T08:33:18",
        "1970-01-01T00:00:00.000000001",
        "2024-02-29T23:59:59.9999999",
        "2025-02-29T00:00:00",
        "2025-13-01T00:00:00",
        "2025-11-25T24:00:00",
        "2025-11-25T08:60:00",
        "2025-11-25T08:33:60",
        "2025-11-25T08:33:18.",
        "2025-11-25T08:33:18.1234567891",
        "2025-11-25T08:33:18Z",
        "2025-11-25 08:33:18",
        "+2025-11-25T08:33:18",
        "2025-1-25T08:33:18.5",
        "0000-01-01T00:00:00",
        "9999-12-31T23:59:59.5",
        "yesterday",
        "",
    ] {
        let value = Value::String(text.to_owned());
        assert_eq!(time_ms(&value), chrono_ms(text), "{text:?}");
        if let Some(ms) = plain_time_ms(text) {
            assert_eq!(Some(ms), chrono_ms(text), "{text:?} read directly");
        }
    }
    assert!(plain_time_ms("2025-11-25T08:33:18.508962742").is_some(), "the node's spelling");
}
