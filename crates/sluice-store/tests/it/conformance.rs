//! Every test here runs twice: on a fresh SQLite file and in a fresh PostgreSQL schema of the
//! server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`; the tests fail without it).

use std::str::FromStr;
use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;
use sluice_core::catalog::Catalog;
use sluice_core::identity::Principal;
use sluice_core::permission::{Access, Grants, UserRole};
use sluice_core::pipeline::Pipeline;
use sluice_core::pipeline::validate::{BodyMode, validate_pipeline_body};
use sluice_store::{Identity, MetadataStore, NewApiKey, PgStore, SqliteStore, UnknownMembers};
use sqlx::postgres::PgConnectOptions;

/// A store plus whatever keeps it alive (the SQLite temp dir).
struct Fixture {
    store: Arc<dyn MetadataStore>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    // Opening again re-runs migrations, which must be a no-op.
    drop(SqliteStore::open(&url).await.unwrap());
    Fixture { store: Arc::new(store), _dir: Some(dir) }
}

async fn postgres() -> Fixture {
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(&url).unwrap().options([("search_path", &schema)]);
    let store = PgStore::open_with(options.clone()).await.unwrap();
    drop(PgStore::open_with(options).await.unwrap());
    Fixture { store: Arc::new(store), _dir: None }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::sqlite().await.store).await;
            })*
        }
        mod on_postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::postgres().await.store).await;
            })*
        }
    };
}

conformance!(
    identity_is_created_once_and_reused,
    operator_flag_upgrades_an_existing_user,
    keys_are_found_by_prefix_until_revoked,
    org_flags_change_only_what_is_given,
    pipeline_round_trips_every_field,
    access_follows_owner_roles_and_viewer_teams,
    list_returns_exactly_the_readable_pipelines_oldest_first,
    update_replaces_fields_and_drops_values_of_removed_set_filters,
    delete_removes_pipeline_grants_and_filter_values,
    unknown_members_are_reported_per_org,
);

fn principal(identity: &Identity) -> Principal {
    Principal {
        user_id: identity.user.id.clone(),
        team_id: identity.team.id.clone(),
        org_id: identity.org.id.clone(),
        is_operator: identity.user.is_operator,
        flags: identity.org.flags,
    }
}

fn pipeline(owner: &Identity, name: &str, age_minutes: i64) -> Pipeline {
    let body = json!({
        "name": name,
        "description": "d",
        "tags": ["a", "b"],
        "static_egress_ip": true,
        "pod_size": "L",
        "delivery_guarantee": "best_effort",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "log", "is_zerolag": true},
            "transforms": [
                {"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.address"},
                {"type": "v8", "uid": "s1", "script": "function transform(r) { return r; }"}
            ],
            "sinks": [{"type": "kafka", "name": "out", "uid": "k1"}]
        }
    });
    let spec =
        validate_pipeline_body(body.as_object().unwrap(), &Catalog::default(), BodyMode::Create)
            .unwrap()
            .spec;
    let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::minutes(age_minutes);
    Pipeline::new(sluice_core::ids::new_id(), spec, owner.user.id.clone(), owner.org.id.clone(), at)
}

async fn identity_is_created_once_and_reused(store: Arc<dyn MetadataStore>) {
    assert!(!store.has_users().await.unwrap());
    let first = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    assert!(store.has_users().await.unwrap());
    assert!(first.org.flags.pipelines && first.org.flags.custom_transforms);
    let again = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    assert_eq!(first.user, again.user);
    let teammate = store.ensure_identity("acme", "data", "bob", false).await.unwrap();
    assert_eq!(teammate.team.id, first.team.id);
    assert_ne!(teammate.user.id, first.user.id);
    let other_team = store.ensure_identity("acme", "ops", "ann", false).await.unwrap();
    assert_eq!(other_team.org.id, first.org.id);
    assert_ne!(other_team.team.id, first.team.id);
    assert_ne!(other_team.user.id, first.user.id);
}

async fn operator_flag_upgrades_an_existing_user(store: Arc<dyn MetadataStore>) {
    let plain = store.ensure_identity("o", "t", "u", false).await.unwrap();
    assert!(!plain.user.is_operator);
    let upgraded = store.ensure_identity("o", "t", "u", true).await.unwrap();
    assert!(upgraded.user.is_operator);
    assert_eq!(upgraded.user.id, plain.user.id);
    let unchanged = store.ensure_identity("o", "t", "u", false).await.unwrap();
    assert!(unchanged.user.is_operator);
}

async fn keys_are_found_by_prefix_until_revoked(store: Arc<dyn MetadataStore>) {
    let who = store.ensure_identity("o", "t", "u", true).await.unwrap();
    for (id, hash) in [("k1", "h1"), ("k2", "h2")] {
        let key = NewApiKey { id, user_id: &who.user.id, prefix: "slk_abcd", hash };
        store.insert_api_key(key).await.unwrap();
    }
    let found = store.api_key_candidates("slk_abcd").await.unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].principal, principal(&who));
    assert!(store.api_key_candidates("slk_zzzz").await.unwrap().is_empty());
    assert!(store.revoke_api_key("h1").await.unwrap());
    assert!(!store.revoke_api_key("h1").await.unwrap());
    assert!(!store.revoke_api_key("nope").await.unwrap());
    let left = store.api_key_candidates("slk_abcd").await.unwrap();
    assert_eq!(left.iter().map(|c| c.hash.as_str()).collect::<Vec<_>>(), vec!["h2"]);
}

async fn org_flags_change_only_what_is_given(store: Arc<dyn MetadataStore>) {
    let who = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let org = store.set_org_flags("o", None, Some(false)).await.unwrap().unwrap();
    assert!(org.flags.pipelines && !org.flags.custom_transforms);
    let org = store.set_org_flags("o", Some(false), None).await.unwrap().unwrap();
    assert!(!org.flags.pipelines && !org.flags.custom_transforms);
    assert!(store.set_org_flags("missing", Some(true), None).await.unwrap().is_none());
    store
        .insert_api_key(NewApiKey { id: "k", user_id: &who.user.id, prefix: "p", hash: "h" })
        .await
        .unwrap();
    let seen = &store.api_key_candidates("p").await.unwrap()[0].principal;
    assert!(!seen.flags.pipelines && !seen.flags.custom_transforms);
}

async fn pipeline_round_trips_every_field(store: Arc<dyn MetadataStore>) {
    let owner = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let mut stored = pipeline(&owner, "p", 0);
    stored.tags = None;
    store.insert_pipeline(&stored, &owner.team.id, &[]).await.unwrap();
    let (read, access) =
        store.pipeline_with_access(&stored.id, &principal(&owner)).await.unwrap().unwrap();
    assert_eq!(read, stored);
    assert_eq!(access, Access { role: Some(UserRole::Owner), viewer_team: true });

    let tagged = pipeline(&owner, "q", 1);
    let values =
        vec![("f1".to_owned(), vec!["0xa".to_owned(), "0xb".to_owned(), "0xa".to_owned()])];
    store.insert_pipeline(&tagged, &owner.team.id, &values).await.unwrap();
    let (read, _) =
        store.pipeline_with_access(&tagged.id, &principal(&owner)).await.unwrap().unwrap();
    assert_eq!(read.tags, Some(vec!["a".to_owned(), "b".to_owned()]));
    assert_eq!(store.filter_value_count(&tagged.id, "f1").await.unwrap(), 2);
    assert!(store.pipeline_with_access("missing", &principal(&owner)).await.unwrap().is_none());
}

async fn access_follows_owner_roles_and_viewer_teams(store: Arc<dyn MetadataStore>) {
    let owner = store.ensure_identity("o", "t1", "owner", false).await.unwrap();
    let teammate = store.ensure_identity("o", "t1", "mate", false).await.unwrap();
    let editor = store.ensure_identity("o", "t2", "editor", false).await.unwrap();
    let reader = store.ensure_identity("o", "t2", "reader", false).await.unwrap();
    let stranger = store.ensure_identity("o", "t3", "stranger", false).await.unwrap();
    let outsider = store.ensure_identity("other", "t1", "owner", false).await.unwrap();
    let p = pipeline(&owner, "p", 0);
    store.insert_pipeline(&p, &owner.team.id, &[]).await.unwrap();
    let grants = Grants {
        editors: vec![editor.user.id.clone()],
        readers: vec![reader.user.id.clone()],
        viewer_teams: vec![owner.team.id.clone(), stranger.team.id.clone()],
    };
    store.replace_pipeline_grants(&p.id, &grants).await.unwrap();
    let mut read_back = store.pipeline_grants(&p.id).await.unwrap();
    read_back.viewer_teams.sort();
    let mut expected = grants.clone();
    expected.viewer_teams.sort();
    assert_eq!(read_back, expected);

    let access = |who: Identity| {
        let store = store.clone();
        let id = p.id.clone();
        async move { store.pipeline_with_access(&id, &principal(&who)).await.unwrap().map(|(_, a)| a) }
    };
    assert_eq!(access(teammate).await, Some(Access { role: None, viewer_team: true }));
    assert_eq!(
        access(editor).await,
        Some(Access { role: Some(UserRole::Editor), viewer_team: false })
    );
    assert_eq!(
        access(reader).await,
        Some(Access { role: Some(UserRole::Reader), viewer_team: false })
    );
    assert_eq!(access(stranger.clone()).await, Some(Access { role: None, viewer_team: true }));
    assert_eq!(access(outsider).await, None, "another org never sees the pipeline");

    store.replace_pipeline_grants(&p.id, &Grants::default()).await.unwrap();
    assert_eq!(store.pipeline_grants(&p.id).await.unwrap(), Grants::default());
    assert_eq!(access(stranger).await, Some(Access::default()));
}

async fn list_returns_exactly_the_readable_pipelines_oldest_first(store: Arc<dyn MetadataStore>) {
    let ann = store.ensure_identity("o", "t1", "ann", false).await.unwrap();
    let bob = store.ensure_identity("o", "t2", "bob", false).await.unwrap();
    let cat = store.ensure_identity("o", "t3", "cat", false).await.unwrap();
    let newer = pipeline(&ann, "newer", 10);
    let older = pipeline(&ann, "older", 5);
    let bobs = pipeline(&bob, "bobs", 1);
    let shared = pipeline(&bob, "shared", 2);
    for (p, team) in [
        (&newer, &ann.team.id),
        (&older, &ann.team.id),
        (&bobs, &bob.team.id),
        (&shared, &bob.team.id),
    ] {
        store.insert_pipeline(p, team, &[]).await.unwrap();
    }
    let grants = Grants { readers: vec![ann.user.id.clone()], ..Grants::default() };
    store.replace_pipeline_grants(&shared.id, &grants).await.unwrap();
    let names = |list: Vec<Pipeline>| list.into_iter().map(|p| p.name).collect::<Vec<_>>();
    assert_eq!(
        names(store.list_readable_pipelines(&principal(&ann)).await.unwrap()),
        ["shared", "older", "newer"]
    );
    assert_eq!(
        names(store.list_readable_pipelines(&principal(&bob)).await.unwrap()),
        ["bobs", "shared"]
    );
    assert!(store.list_readable_pipelines(&principal(&cat)).await.unwrap().is_empty());
}

async fn update_replaces_fields_and_drops_values_of_removed_set_filters(
    store: Arc<dyn MetadataStore>,
) {
    let owner = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let mut p = pipeline(&owner, "p", 0);
    let body = json!({
        "name": "p", "description": "d",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "log"},
            "transforms": [
                {"type": "redis_set_filter", "uid": "keep", "filter_expr": "root = this.address"},
                {"type": "redis_set_filter", "uid": "drop", "filter_expr": "root = this.topic0"},
                {"type": "redis_set_filter", "uid": "becomes_script", "filter_expr": "root = this.a"}
            ],
            "sinks": [{"type": "kafka", "name": "out"}]
        }
    });
    p.pipeline_config =
        validate_pipeline_body(body.as_object().unwrap(), &Catalog::default(), BodyMode::Create)
            .unwrap()
            .spec
            .pipeline_config;
    let values: Vec<(String, Vec<String>)> = ["keep", "drop", "becomes_script"]
        .iter()
        .map(|uid| (uid.to_string(), vec!["x".to_owned()]))
        .collect();
    store.insert_pipeline(&p, &owner.team.id, &values).await.unwrap();

    let mut changed = p.clone();
    changed.name = "renamed".into();
    changed.pod_size = sluice_core::pipeline::PodSize::XL;
    changed.updated_at = p.updated_at + Duration::seconds(5);
    changed.pipeline_config.transforms = vec![
        p.pipeline_config.transforms[0].clone(),
        sluice_core::pipeline::Transform::Script {
            uid: "becomes_script".into(),
            script: "function transform(r) { return r; }".into(),
        },
    ];
    assert!(store.update_pipeline(&changed).await.unwrap());
    let (read, _) = store.pipeline_with_access(&p.id, &principal(&owner)).await.unwrap().unwrap();
    assert_eq!(read, changed);
    assert_eq!(read.created_at, p.created_at);
    assert_eq!(store.filter_value_count(&p.id, "keep").await.unwrap(), 1);
    assert_eq!(store.filter_value_count(&p.id, "drop").await.unwrap(), 0);
    assert_eq!(store.filter_value_count(&p.id, "becomes_script").await.unwrap(), 0);

    let mut missing = changed.clone();
    missing.id = "missing".into();
    assert!(!store.update_pipeline(&missing).await.unwrap());
}

async fn delete_removes_pipeline_grants_and_filter_values(store: Arc<dyn MetadataStore>) {
    let owner = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let reader = store.ensure_identity("o", "t2", "r", false).await.unwrap();
    let p = pipeline(&owner, "p", 0);
    let values =
        vec![("f1".to_owned(), (0..2500).map(|i| format!("0x{i:04x}")).collect::<Vec<_>>())];
    store.insert_pipeline(&p, &owner.team.id, &values).await.unwrap();
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 2500);
    let grants = Grants { readers: vec![reader.user.id.clone()], ..Grants::default() };
    store.replace_pipeline_grants(&p.id, &grants).await.unwrap();

    assert!(store.delete_pipeline(&p.id).await.unwrap());
    assert!(!store.delete_pipeline(&p.id).await.unwrap());
    assert!(store.pipeline_with_access(&p.id, &principal(&owner)).await.unwrap().is_none());
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 0);
    assert_eq!(store.pipeline_grants(&p.id).await.unwrap(), Grants::default());
    assert!(store.list_readable_pipelines(&principal(&reader)).await.unwrap().is_empty());
}

async fn unknown_members_are_reported_per_org(store: Arc<dyn MetadataStore>) {
    let ann = store.ensure_identity("o", "t", "ann", false).await.unwrap();
    let outsider = store.ensure_identity("x", "t", "out", false).await.unwrap();
    let unknown = store
        .unknown_members(
            &ann.org.id,
            &[ann.user.id.clone(), outsider.user.id.clone(), "nobody".into()],
            &[ann.team.id.clone(), outsider.team.id.clone()],
        )
        .await
        .unwrap();
    assert_eq!(
        unknown,
        UnknownMembers {
            users: vec![outsider.user.id, "nobody".into()],
            teams: vec![outsider.team.id]
        }
    );
}
