//! Transfers, swaps and decoded logs made on the node arrive with exact fields.

use std::time::{Duration, Instant};

use alloy_dyn_abi::DynSolValue;
use alloy_primitives::U256;
use serde_json::{Value, json};
use sluice_chains::{Ingester, StatusSnapshot};

use crate::anvil::{
    ALICE, Anvil, BOB, address, config, int, positions, records, stream_log, text, uint,
};

/// Steps `ingester` until its finalized streams reach `block`.
pub async fn ingest_until(
    ingester: &mut Ingester,
    status: &sluice_chains::ChainStatus,
    block: u64,
) -> StatusSnapshot {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let progressed = ingester.step().await.expect("an ingest step");
        let snapshot = status.snapshot();
        if snapshot.ingested >= Some(block) {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "ingest did not reach block {block}: {snapshot:?}");
        if !progressed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn one<'a>(records: &'a [Value], field: &str, value: &Value) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| &r[field] == value).collect();
    assert_eq!(found.len(), 1, "one record with {field} = {value} in {records:#?}");
    found[0]
}

#[tokio::test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario on a real chain: contracts deployed, transactions sent, then every record checked field by field"
)]
async fn transfers_swaps_and_decoded_logs_arrive_with_exact_fields() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    let weth = anvil.deploy("TestToken", vec![text("Wrapped Ether"), text("WETH"), uint(18)]).await;
    let bare = anvil.deploy("BareToken", vec![]).await;
    let nft = anvil.deploy("TestNft", vec![]).await;
    let multi = anvil.deploy("TestMulti", vec![]).await;
    let pair = anvil.deploy("TestPair", vec![address(&usdc), address(&weth)]).await;

    let mint = anvil
        .invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(ALICE), uint(5_000_000_000)])
        .await;
    anvil
        .invoke(ALICE, &weth, "mint(address,uint256)", vec![address(ALICE), uint(10u128.pow(21))])
        .await;
    let transfer = anvil
        .invoke(ALICE, &usdc, "transfer(address,uint256)", vec![address(BOB), uint(1_234_560_000)])
        .await;
    let bare_mint =
        anvil.invoke(ALICE, &bare, "mint(address,uint256)", vec![address(BOB), uint(42)]).await;
    let nft_mint =
        anvil.invoke(ALICE, &nft, "mint(address,uint256)", vec![address(ALICE), uint(7)]).await;
    anvil
        .invoke(
            ALICE,
            &multi,
            "mint(address,uint256,uint256)",
            vec![address(ALICE), uint(1), uint(10)],
        )
        .await;
    anvil
        .invoke(
            ALICE,
            &multi,
            "mint(address,uint256,uint256)",
            vec![address(ALICE), uint(2), uint(20)],
        )
        .await;
    let batch = anvil
        .invoke(
            ALICE,
            &multi,
            "safeBatchTransferFrom(address,address,uint256[],uint256[])",
            vec![
                address(ALICE),
                address(BOB),
                DynSolValue::Array(vec![uint(1), uint(2)]),
                DynSolValue::Array(vec![uint(3), uint(4)]),
            ],
        )
        .await;
    // Liquidity: 1,000 USDC and 1 WETH in the pool, then a swap of 100 USDC for 0.09 WETH.
    anvil
        .invoke(
            ALICE,
            &usdc,
            "transfer(address,uint256)",
            vec![address(&pair), uint(1_000_000_000)],
        )
        .await;
    anvil
        .invoke(
            ALICE,
            &weth,
            "transfer(address,uint256)",
            vec![address(&pair), uint(10u128.pow(18))],
        )
        .await;
    anvil.invoke(ALICE, &pair, "sync()", vec![]).await;
    anvil
        .invoke(ALICE, &usdc, "approve(address,uint256)", vec![address(&pair), uint(100_000_000)])
        .await;
    anvil
        .invoke(
            ALICE,
            &pair,
            "swapFrom(uint256,uint256,uint256,uint256,address)",
            vec![uint(100_000_000), uint(0), uint(0), uint(90_000_000_000_000_000), address(ALICE)],
        )
        .await;
    let swap_block = anvil.head().await;
    anvil.mine(3).await;

    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&anvil.url, 3);
    config.stablecoins = vec![usdc.clone()];
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    let snapshot = ingest_until(&mut ingester, &status, swap_block).await;
    assert_eq!(snapshot.head, Some(swap_block + 3));
    assert_eq!(snapshot.lag_blocks, Some(3));

    let erc20 = records(&log, "base.erc20_token_transfer").await;
    let tx = transfer["transactionHash"].as_str().unwrap();
    let record = one(&erc20, "transaction_hash", &json!(tx));
    let block_hash = transfer["blockHash"].as_str().unwrap();
    let block_number =
        u64::from_str_radix(transfer["blockNumber"].as_str().unwrap().trim_start_matches("0x"), 16)
            .unwrap();
    let header = anvil.call("eth_getBlockByNumber", json!([transfer["blockNumber"], false])).await;
    let time =
        i64::from_str_radix(header["timestamp"].as_str().unwrap().trim_start_matches("0x"), 16)
            .unwrap();
    let expected = json!({
        "token_address": usdc, "token_name": "USD Coin", "token_symbol": "USDC",
        "from_address": ALICE, "to_address": BOB,
        "raw_amount_str": "1234560000", "raw_amount": 1_234_560_000.0,
        "amount_str": "1234.56", "amount": 1234.56,
        "transaction_hash": tx, "transaction_index": 0, "log_index": 0,
        "block_number": block_number,
        "block_timestamp": chrono::DateTime::from_timestamp(time, 0).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "block_hash": block_hash,
    });
    assert_eq!(record, &expected);
    let minted = one(&erc20, "transaction_hash", &mint["transactionHash"]);
    assert_eq!(minted["from_address"], "0x0000000000000000000000000000000000000000");

    // A token without name/symbol/decimals: null metadata, amount in base units.
    let bare_record = one(&erc20, "transaction_hash", &bare_mint["transactionHash"]);
    assert_eq!(bare_record["token_name"], Value::Null);
    assert_eq!(bare_record["token_symbol"], Value::Null);
    assert_eq!(bare_record["amount_str"], "42");
    assert_eq!(bare_record["raw_amount_str"], "42");

    let erc721 = records(&log, "base.erc721_token_transfer").await;
    assert_eq!(
        erc721.len(),
        1,
        "the NFT mint only (ERC-20 transfers are not ERC-721): {erc721:#?}"
    );
    let nft_record = one(&erc721, "transaction_hash", &nft_mint["transactionHash"]);
    assert_eq!(nft_record["token_id"], "7");
    assert_eq!(nft_record["token_symbol"], "KIT");
    assert_eq!(nft_record["to_address"], ALICE);

    let erc1155 = records(&log, "base.erc1155_token_transfer").await;
    let batch_records: Vec<&Value> =
        erc1155.iter().filter(|r| r["transaction_hash"] == batch["transactionHash"]).collect();
    assert_eq!(batch_records.len(), 2);
    let mut items: Vec<(String, String)> = batch_records
        .iter()
        .map(|r| {
            (
                r["token_id"].as_str().unwrap().to_owned(),
                r["amount_str"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    items.sort();
    assert_eq!(items, vec![("1".to_owned(), "3".to_owned()), ("2".to_owned(), "4".to_owned())]);
    assert!(batch_records.iter().all(|r| r["event_type"] == "TransferBatch"
        && r["operator"] == ALICE
        && r["to_address"] == BOB));
    assert_eq!(erc1155.len(), 4, "two mints and a batch of two");

    let trades = records(&log, "base.dex_trade").await;
    assert_eq!(trades.len(), 2, "{trades:#?}");
    let usdc_side = one(&trades, "token_address", &json!(usdc));
    let weth_side = one(&trades, "token_address", &json!(weth));
    assert_eq!(usdc_side["token_amount"], "100");
    assert_eq!(usdc_side["token_decimals"], 6);
    assert_eq!(usdc_side["usd_amount"], "100");
    assert_eq!(usdc_side["token_reserve"], "1100");
    assert_eq!(usdc_side["pool_address"], json!(pair));
    assert_eq!(usdc_side["chain"], "base");
    assert_eq!(weth_side["token_amount"], "0.09");
    assert_eq!(weth_side["usd_amount"], "100");
    assert_eq!(weth_side["token_reserve"], "0.91");
    assert_eq!(usdc_side["block_number"], swap_block);
    assert_ne!(usdc_side["log_index"], weth_side["log_index"]);
    assert_eq!(usdc_side["transaction_hash"], weth_side["transaction_hash"]);

    let decoded = records(&log, "base.decoded_log").await;
    let swap = decoded.iter().find(|r| r["name"] == "Swap").expect("the swap decoded");
    assert_eq!(swap["signature"], "Swap(address,uint256,uint256,uint256,uint256,address)");
    assert_eq!(
        swap["params"],
        json!({"sender": ALICE, "amount0In": "100000000", "amount1In": "0", "amount0Out": "0", "amount1Out": "90000000000000000", "to": ALICE})
    );
    let raw_logs = records(&log, "base.log").await;
    assert_eq!(raw_logs.len(), decoded.len(), "every test contract event is a known one");
    let raw = one(&raw_logs, "transaction_hash", &json!(tx));
    assert_eq!(raw["address"], json!(usdc));
    assert_eq!(raw["from_address"], ALICE);
    assert_eq!(raw["to_address"], json!(usdc));
    assert_eq!(raw["topic0"], "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef");
    assert_eq!(raw["topic3"], Value::Null);
    assert_eq!(raw["data"], format!("0x{:064x}", 1_234_560_000u64));

    // The zerolag streams got everything too, and the finalized ones nothing past the rule.
    let zerolag = records(&log, "base.erc20_token_transfer.zerolag").await;
    assert_eq!(zerolag.len(), erc20.len());
    assert!(erc20.iter().all(|r| r["block_number"].as_u64().unwrap() <= swap_block));
}

#[tokio::test]
async fn only_the_entities_the_catalog_lists_are_written() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(5)]).await;
    anvil.mine(2).await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&anvil.url, 1);
    // As the default catalog has `abstract`: transfers without a zerolag twin, and no logs.
    config.entities = vec![("erc20_token_transfer".to_owned(), false)];
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    ingest_until(&mut ingester, &status, anvil.head().await - 1).await;
    assert_eq!(records(&log, "base.erc20_token_transfer").await.len(), 1);
    for topic in
        ["base.erc20_token_transfer.zerolag", "base.log", "base.log.zerolag", "base.decoded_log"]
    {
        assert!(records(&log, topic).await.is_empty(), "{topic}");
    }
}

/// `finality = "finalized_tag"` on a node that has the tag (Anvil's `finalized` block is two
/// epochs, 64 blocks, behind its head): the zerolag streams get a transfer at once, the
/// finalized streams only once the node calls its block finalized, and then exactly once.
#[tokio::test]
async fn the_finalized_tag_decides_what_the_finalized_streams_get() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    anvil.mine(70).await;
    let minted =
        anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(5)]).await;
    let block =
        u64::from_str_radix(minted["blockNumber"].as_str().unwrap().trim_start_matches("0x"), 16)
            .unwrap();
    anvil.mine(10).await;
    let node_finalized = |header: Value| {
        u64::from_str_radix(header["number"].as_str().unwrap().trim_start_matches("0x"), 16)
            .unwrap()
    };
    let finalized_then =
        node_finalized(anvil.call("eth_getBlockByNumber", json!(["finalized", false])).await);
    assert!(finalized_then < block, "the node finalized the transfer's block already");

    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&anvil.url, 1);
    config.finality = sluice_chains::Finality::Tag;
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    let snapshot = ingest_until(&mut ingester, &status, finalized_then).await;
    assert_eq!(snapshot.finalized, Some(finalized_then));
    assert_eq!(snapshot.ingested, Some(finalized_then), "past the node's finalized block");
    let deadline = Instant::now() + Duration::from_secs(60);
    while status.snapshot().zerolag_ingested < Some(block) {
        assert!(Instant::now() < deadline, "the zerolag streams never reached the transfer");
        if !ingester.step().await.unwrap() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(records(&log, "base.erc20_token_transfer.zerolag").await.len(), 1);
    assert!(records(&log, "base.erc20_token_transfer").await.is_empty());

    // Once the node calls the block finalized, the finalized streams take it, once.
    anvil.mine(64).await;
    let snapshot = ingest_until(&mut ingester, &status, block).await;
    assert!(snapshot.finalized >= Some(block), "{snapshot:?}");
    let finalized = records(&log, "base.erc20_token_transfer").await;
    assert_eq!(finalized.len(), 1);
    assert_eq!(finalized[0]["block_number"], json!(block));
    assert_eq!(records(&log, "base.erc20_token_transfer.zerolag").await.len(), 1);
}

/// With the node's WebSocket endpoint, `newHeads` wakes the ingester as soon as a block is
/// mined: with a 30-second head poll, a transfer still reaches the zerolag stream within
/// seconds (without the subscription it would wait for the next poll).
#[tokio::test]
async fn new_heads_over_websocket_wake_the_ingester_before_its_poll() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&anvil.url, 1);
    config.poll_interval = Duration::from_secs(30);
    config.ws_url = Some(anvil.url.replace("http://", "ws://"));
    let status = Ingester::status_for(&config);
    let ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    let running = tokio::spawn(ingester.run());
    // Caught up with the head first (the first steps run without waiting)...
    let head = anvil.head().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while status.snapshot().zerolag_ingested < Some(head) {
        assert!(Instant::now() < deadline, "never caught up: {:?}", status.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and idle in its 30-second wait, the subscription made, when the block comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(5)]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while records(&log, "base.erc20_token_transfer.zerolag").await.is_empty() {
        assert!(Instant::now() < deadline, "the new head did not wake the ingester");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.abort();
}

/// A V3 swap's `token_reserve` is the pool's balance just after it: with two swaps in one
/// block, the first's is the block's end balance less the second's transfers. A trade with
/// no stablecoin leg is valued through its priced leg: WETH, priced by a USDC pair's trade.
#[tokio::test]
async fn v3_reserves_and_usd_values_through_a_priced_leg() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    let weth = anvil.deploy("TestToken", vec![text("Wrapped Ether"), text("WETH"), uint(18)]).await;
    let pepe = anvil.deploy("TestToken", vec![text("Pepe"), text("PEPE"), uint(18)]).await;
    let pair = anvil.deploy("TestPair", vec![address(&usdc), address(&weth)]).await;
    let pool = anvil.deploy("TestPoolV3", vec![address(&pepe), address(&weth)]).await;
    let e18 = 10u128.pow(18);
    for (token, amount) in [(&usdc, 10_000_000_000), (&weth, 100 * e18), (&pepe, 10_000_000 * e18)]
    {
        anvil
            .invoke(ALICE, token, "mint(address,uint256)", vec![address(ALICE), uint(amount)])
            .await;
    }
    let transfer = "transfer(address,uint256)";
    let approve = "approve(address,uint256)";
    // WETH's price: 1,000 USDC and 1 WETH in the pair, then 200 USDC in for 0.1 WETH out.
    anvil.invoke(ALICE, &usdc, transfer, vec![address(&pair), uint(1_000_000_000)]).await;
    anvil.invoke(ALICE, &weth, transfer, vec![address(&pair), uint(e18)]).await;
    anvil.invoke(ALICE, &pair, "sync()", vec![]).await;
    anvil.invoke(ALICE, &usdc, approve, vec![address(&pair), uint(200_000_000)]).await;
    anvil
        .invoke(
            ALICE,
            &pair,
            "swapFrom(uint256,uint256,uint256,uint256,address)",
            vec![uint(200_000_000), uint(0), uint(0), uint(e18 / 10), address(ALICE)],
        )
        .await;
    // The V3 pool holds 1,000,000 PEPE and 2 WETH.
    anvil.invoke(ALICE, &pepe, transfer, vec![address(&pool), uint(1_000_000 * e18)]).await;
    anvil.invoke(ALICE, &weth, transfer, vec![address(&pool), uint(2 * e18)]).await;
    anvil.invoke(ALICE, &pepe, approve, vec![address(&pool), uint(1_000_000 * e18)]).await;
    anvil.invoke(ALICE, &weth, approve, vec![address(&pool), uint(e18)]).await;
    // One block: 10,000 PEPE in for 0.01 WETH out, then 0.006 WETH in for 5,000 PEPE out.
    let swap = "swap(int256,int256,address,uint160,uint128,int24)";
    let state = || {
        vec![
            DynSolValue::Uint(U256::from(1u8) << 96, 160),
            DynSolValue::Uint(U256::from(1_000_000u32), 128),
            DynSolValue::Int(alloy_primitives::I256::try_from(-5).unwrap(), 24),
        ]
    };
    let first =
        [vec![int(10_000 * 10i128.pow(18)), int(-(10i128.pow(16))), address(ALICE)], state()]
            .concat();
    let second =
        [vec![int(-5_000 * 10i128.pow(18)), int(6 * 10i128.pow(15)), address(BOB)], state()]
            .concat();
    let receipts = anvil
        .invoke_in_one_block(vec![(ALICE, &pool, swap, first), (ALICE, &pool, swap, second)])
        .await;
    assert_eq!(receipts[0]["blockNumber"], receipts[1]["blockNumber"]);
    let swap_block = anvil.head().await;
    anvil.mine(1).await;

    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&anvil.url, 1);
    config.stablecoins = vec![usdc.clone()];
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    ingest_until(&mut ingester, &status, swap_block).await;

    let trades = records(&log, "base.dex_trade").await;
    let side = |receipt: &Value, token: &str| -> Value {
        let found: Vec<&Value> = trades
            .iter()
            .filter(|t| {
                t["transaction_hash"] == receipt["transactionHash"] && t["token_address"] == token
            })
            .collect();
        assert_eq!(found.len(), 1, "{token} in {trades:#?}");
        found[0].clone()
    };
    let v2_weth = trades
        .iter()
        .find(|t| t["pool_address"] == json!(pair) && t["token_address"] == json!(weth))
        .unwrap();
    assert_eq!(v2_weth["usd_amount"], "200");
    let (a_pepe, a_weth) = (side(&receipts[0], &pepe), side(&receipts[0], &weth));
    assert_eq!(a_pepe["token_amount"], "10000");
    assert_eq!(a_weth["token_amount"], "0.01");
    assert_eq!(a_pepe["usd_amount"], "20", "0.01 WETH at 2,000 USD");
    assert_eq!(a_weth["usd_amount"], "20");
    assert_eq!(a_pepe["token_reserve"], "1010000");
    assert_eq!(a_weth["token_reserve"], "1.99");
    assert_eq!(a_pepe["pool_address"], json!(pool));
    let (b_pepe, b_weth) = (side(&receipts[1], &pepe), side(&receipts[1], &weth));
    assert_eq!(b_pepe["usd_amount"], "12", "0.006 WETH at 2,000 USD");
    assert_eq!(b_pepe["token_reserve"], "1005000");
    assert_eq!(b_weth["token_reserve"], "1.996");
    assert_eq!(b_weth["block_number"], swap_block);
    let decoded = records(&log, "base.decoded_log").await;
    let v3 = decoded
        .iter()
        .find(|r| r["signature"] == "Swap(address,address,int256,int256,uint160,uint128,int24)")
        .expect("the V3 swap decoded");
    assert_eq!(v3["params"]["tick"], "-5");
}
