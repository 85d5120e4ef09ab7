//! Warehouse tables: one per chain stream with a block-timestamped schema, named like the
//! hosted warehouse (`base.assets.erc20_token_transfers`), with columns typed from the
//! stream's record schema ([`sluice_core::streams`]).
//!
//! Column types: `integer` fields are `Int64`, `number` fields `Float64`, `block_timestamp`
//! a UTC microsecond timestamp, every other field text (decimal amounts stay decimal strings,
//! exact; objects and arrays are their JSON text). Two columns of ours follow the record's:
//! `_key`, the stream key (unique per table), and `_record`, the record's JSON exactly as the
//! stream carried it — what a backfill delivers.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use sluice_core::catalog::Catalog;
use sluice_core::streams::{EntitySchema, entity_schema};

/// The chain whose tables backfills may read (docs/contract.md §Backfill endpoints: base only).
pub const BACKFILL_CHAIN: &str = "base";

/// `(entity, table name without the chain)` of every table kind.
pub const TABLE_KINDS: [(&str, &str); 6] = [
    ("log", "raw.logs"),
    ("decoded_log", "decoded.logs"),
    ("erc20_token_transfer", "assets.erc20_token_transfers"),
    ("erc721_token_transfer", "assets.erc721_token_transfers"),
    ("erc1155_token_transfer", "assets.erc1155_token_transfers"),
    ("dex_trade", "dex.trades"),
];

/// The key column.
pub const KEY_COLUMN: &str = "_key";
/// The record column.
pub const RECORD_COLUMN: &str = "_record";
/// The time column every table is partitioned and sorted by.
pub const TIME_COLUMN: &str = "block_timestamp";

/// A column's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Int,
    Float,
    Time,
    Text,
}

/// One warehouse table.
#[derive(Debug, Clone)]
pub struct Table {
    /// `<chain>.<kind>` (e.g. `base.dex.trades`).
    pub name: String,
    pub chain: String,
    pub entity: &'static str,
    /// The record fields as columns, in schema order, then `_key` and `_record`.
    pub columns: Vec<(&'static str, ColumnKind)>,
    pub schema: Arc<Schema>,
}

impl Table {
    fn new(chain: &str, entity: &'static str, kind: &str, schema: &'static EntitySchema) -> Self {
        let mut columns: Vec<(&'static str, ColumnKind)> = schema
            .fields
            .iter()
            .map(|(name, description)| {
                let kind = if *name == TIME_COLUMN {
                    ColumnKind::Time
                } else if description.starts_with("integer") {
                    ColumnKind::Int
                } else if description.starts_with("number") {
                    ColumnKind::Float
                } else {
                    ColumnKind::Text
                };
                (*name, kind)
            })
            .collect();
        columns.push((KEY_COLUMN, ColumnKind::Text));
        columns.push((RECORD_COLUMN, ColumnKind::Text));
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, kind)| {
                let (data_type, nullable) = match kind {
                    ColumnKind::Int => (DataType::Int64, true),
                    ColumnKind::Float => (DataType::Float64, true),
                    ColumnKind::Time => {
                        (DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false)
                    }
                    ColumnKind::Text => (DataType::Utf8, !name.starts_with('_')),
                };
                Field::new(*name, data_type, nullable)
            })
            .collect();
        Self {
            name: format!("{chain}.{kind}"),
            chain: chain.to_owned(),
            entity,
            columns,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    /// The chain stream the table archives (finalized records: not the `.zerolag` twin).
    pub fn stream(&self) -> String {
        sluice_bus::topics::chain_stream(&self.chain, self.entity, false)
    }

    /// Whether backfills may read it.
    pub fn is_backfillable(&self) -> bool {
        self.chain == BACKFILL_CHAIN
    }

    /// The kind of `column`, if the table has it (ours, `_key` and `_record`, excluded).
    pub fn column(&self, column: &str) -> Option<ColumnKind> {
        self.columns
            .iter()
            .find(|(name, _)| *name == column && !name.starts_with('_'))
            .map(|(_, kind)| *kind)
    }
}

/// Every table of the catalog's chains whose streams have a block-timestamped record schema.
pub fn tables(catalog: &Catalog) -> Vec<Table> {
    let mut out = Vec::new();
    for chain in catalog.chains() {
        let entities = catalog.entities(chain);
        for (entity, kind) in TABLE_KINDS {
            if !entities.contains(&entity) {
                continue;
            }
            if let Some(schema) = entity_schema(entity) {
                out.push(Table::new(chain, entity, kind, schema));
            }
        }
    }
    out
}

/// The time column of a [`layout`] without a typed table.
pub const GENERIC_TIME_COLUMN: &str = "_time";

/// How records of `chain`'s `entity` stream are laid out in a file: as the warehouse table
/// of that stream when there is one (typed columns, then `_key` and `_record`), else
/// `_time` (the record's time), `_key` and `_record`.
pub fn layout(chain: &str, entity: &str) -> Table {
    let kind = TABLE_KINDS.iter().find(|(e, _)| *e == entity).map(|(_, kind)| *kind);
    match (kind, entity_schema(entity)) {
        (Some(kind), Some(schema)) => Table::new(chain, schema.entity, kind, schema),
        (_, schema) => {
            let columns = vec![
                (GENERIC_TIME_COLUMN, ColumnKind::Time),
                (KEY_COLUMN, ColumnKind::Text),
                (RECORD_COLUMN, ColumnKind::Text),
            ];
            let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            let fields = vec![
                Field::new(GENERIC_TIME_COLUMN, time, false),
                Field::new(KEY_COLUMN, DataType::Utf8, false),
                Field::new(RECORD_COLUMN, DataType::Utf8, false),
            ];
            Table {
                name: format!("{chain}.{entity}"),
                chain: chain.to_owned(),
                entity: schema.map_or("", |s| s.entity),
                columns,
                schema: Arc::new(Schema::new(fields)),
            }
        }
    }
}

/// The table named `name`.
pub fn table(catalog: &Catalog, name: &str) -> Option<Table> {
    tables(catalog).into_iter().find(|table| table.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_has_the_hosted_warehouse_names_with_typed_columns() {
        let catalog = Catalog::default();
        let names: Vec<String> =
            tables(&catalog).into_iter().filter(|t| t.chain == "base").map(|t| t.name).collect();
        for expected in [
            "base.raw.logs",
            "base.decoded.logs",
            "base.assets.erc20_token_transfers",
            "base.assets.erc721_token_transfers",
            "base.assets.erc1155_token_transfers",
            "base.dex.trades",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} in {names:?}");
        }
        let transfers = table(&catalog, "base.assets.erc20_token_transfers").unwrap();
        assert!(transfers.is_backfillable());
        assert_eq!(transfers.stream(), "base.erc20_token_transfer");
        assert_eq!(transfers.column("block_number"), Some(ColumnKind::Int));
        assert_eq!(transfers.column("block_timestamp"), Some(ColumnKind::Time));
        assert_eq!(transfers.column("amount_str"), Some(ColumnKind::Text));
        assert_eq!(transfers.column("amount"), Some(ColumnKind::Float));
        assert_eq!(transfers.column("_record"), None);
        assert_eq!(transfers.column("nope"), None);
        let other = tables(&catalog).into_iter().find(|t| t.chain != "base").unwrap();
        assert!(!other.is_backfillable());
    }
}
