//! Every test here runs twice: on a fresh SQLite file and in a fresh PostgreSQL schema of the
//! server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`; the tests fail without it).

use std::str::FromStr;
use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;
use sluice_core::catalog::Catalog;
use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::identity::Principal;
use sluice_core::permission::{Access, Grants, UserRole};
use sluice_core::pipeline::Pipeline;
use sluice_core::pipeline::validate::{BodyMode, validate_pipeline_body};
use sluice_store::{
    FilterValuePage, Identity, MetadataStore, NewApiKey, PgStore, SqliteStore, UnknownMembers,
};

on_both_backends!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
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
    filter_value_counts_ignore_repeats_and_absent_values,
    replace_makes_the_set_exactly_the_values_and_empty_clears_it,
    bulk_changes_cross_statement_chunks,
    listing_pages_in_insertion_order_with_an_exact_last_page,
    values_added_between_pages_list_after_and_nothing_repeats,
    paging_while_another_task_adds_is_a_prefix_of_the_final_listing,
    filter_values_are_isolated_per_transform_and_pipeline,
    values_are_stored_only_for_set_filters_of_the_stored_config,
    delete_pipeline_removes_its_values_and_deployment,
    deployment_round_trips_and_upserts,
    the_deployments_number_moves_with_every_write_of_a_deployment,
    a_set_filter_removed_and_added_again_starts_empty,
    secrets_are_sealed_per_org_revised_on_write_and_resealed_after_rotation,
    backfill_jobs_list_per_org_in_creation_order_and_update_only_from_the_given_states,
);

// The set-filter suite again, with the values in Redis.
on_redis_sets!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
    update_replaces_fields_and_drops_values_of_removed_set_filters,
    delete_removes_pipeline_grants_and_filter_values,
    filter_value_counts_ignore_repeats_and_absent_values,
    replace_makes_the_set_exactly_the_values_and_empty_clears_it,
    bulk_changes_cross_statement_chunks,
    listing_pages_in_insertion_order_with_an_exact_last_page,
    values_added_between_pages_list_after_and_nothing_repeats,
    paging_while_another_task_adds_is_a_prefix_of_the_final_listing,
    filter_values_are_isolated_per_transform_and_pipeline,
    values_are_stored_only_for_set_filters_of_the_stored_config,
    delete_pipeline_removes_its_values_and_deployment,
    a_set_filter_removed_and_added_again_starts_empty,
);

/// Two stores on one database, as two server processes: each decides membership from its
/// own copy of a set in memory, so each must see the other's writes before its next one.
mod two_processes {
    use super::*;

    async fn writes_of_another_process_are_seen_before_the_next_write(
        a: Arc<dyn MetadataStore>,
        b: Arc<dyn MetadataStore>,
    ) {
        let (_, p) = stored_pipeline(a.as_ref()).await;
        assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb"])).await.unwrap(), 2);
        assert!(b.has_filter_value(&p.id, "f1", "0xa").await.unwrap());
        assert_eq!(b.add_filter_values(&p.id, "f1", &strings(&["0xc"])).await.unwrap(), 1);
        assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xc", "0xd"])).await.unwrap(), 1);
        assert_eq!(
            b.remove_filter_values(&p.id, "f1", &strings(&["0xd", "0xa"])).await.unwrap(),
            2
        );
        assert!(!a.has_filter_value(&p.id, "f1", "0xd").await.unwrap());
        assert_eq!(a.remove_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap(), 0);
        assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap(), 1);
        b.replace_filter_values(&p.id, "f1", &strings(&["0xe"])).await.unwrap();
        assert!(!a.has_filter_value(&p.id, "f1", "0xa").await.unwrap());
        assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xe", "0xf"])).await.unwrap(), 1);
        assert_eq!(list_all(b.as_ref(), &p.id, "f1", 10).await, ["0xe", "0xf"]);
        assert_eq!(b.filter_value_count(&p.id, "f1").await.unwrap(), 2);

        // The whole set, from the writer's copy and read afresh by the other process.
        let many: Vec<String> = (0..250_000).map(|i| format!("0x{i:040x}")).collect();
        a.add_filter_values(&p.id, "f1", &many).await.unwrap();
        a.remove_filter_values(&p.id, "f1", &strings(&["0xe"])).await.unwrap();
        for store in [&a, &b] {
            let set = store.filter_value_set(&p.id, "f1").await.unwrap();
            assert_eq!(set.len(), 250_001);
            assert!(set.contains("0xf") && !set.contains("0xe"));
            assert!(many.iter().step_by(997).all(|v| set.contains(v)));
        }
        assert!(a.filter_value_set(&p.id, "f2").await.unwrap().is_empty(), "never written");
    }

    #[tokio::test]
    async fn on_sqlite() {
        let fixture = crate::sqlite(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
        writes_of_another_process_are_seen_before_the_next_write(fixture.store, fixture.other)
            .await;
    }

    #[tokio::test]
    async fn on_postgres() {
        let fixture = crate::postgres(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
        writes_of_another_process_are_seen_before_the_next_write(fixture.store, fixture.other)
            .await;
    }

    #[tokio::test]
    async fn on_redis_sets() {
        let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
        writes_of_another_process_are_seen_before_the_next_write(fixture.store, fixture.other)
            .await;
    }

    /// PostgreSQL refuses a NUL in text: the write fails after the store's copy took the
    /// value, and the copy must not keep it.
    #[tokio::test]
    async fn a_failed_write_leaves_no_trace_in_memory() {
        let fixture = crate::postgres(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
        let store = fixture.store;
        let (_, p) = stored_pipeline(store.as_ref()).await;
        store.add_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap();
        let bad = strings(&["0xb", "nul\u{0}"]);
        assert!(store.add_filter_values(&p.id, "f1", &bad).await.is_err());
        assert!(!store.has_filter_value(&p.id, "f1", "0xb").await.unwrap());
        assert_eq!(store.add_filter_values(&p.id, "f1", &strings(&["0xb"])).await.unwrap(), 1);
        assert_eq!(list_all(store.as_ref(), &p.id, "f1", 10).await, ["0xa", "0xb"]);
        assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 2);
    }
}

fn principal(identity: &Identity) -> Principal {
    Principal {
        user_id: identity.user.id.clone(),
        team_id: identity.team.id.clone(),
        org_id: identity.org.id.clone(),
        is_operator: identity.user.is_operator,
        is_org_admin: false,
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
                {"type": "redis_set_filter", "uid": "becomes_script", "filter_expr": "root = this.data"}
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

pub(crate) fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

/// Every value of a set, paging `limit` at a time.
pub(crate) async fn list_all(
    store: &dyn MetadataStore,
    id: &str,
    uid: &str,
    limit: u32,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_filter_values(id, uid, after, limit).await.unwrap();
        out.extend(page.values);
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

/// A pipeline with set filters `f1` and `f2` and a script `s1`.
fn filter_pipeline(owner: &Identity, name: &str, age_minutes: i64) -> Pipeline {
    let mut p = pipeline(owner, name, age_minutes);
    let f2 = sluice_core::pipeline::Transform::SetFilter {
        uid: "f2".into(),
        filter_expr: "root = this.topic0".into(),
    };
    p.pipeline_config.transforms.insert(1, f2);
    p
}

pub(crate) async fn stored_pipeline(store: &dyn MetadataStore) -> (Identity, Pipeline) {
    let owner = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let p = filter_pipeline(&owner, "p", 0);
    store.insert_pipeline(&p, &owner.team.id, &[]).await.unwrap();
    (owner, p)
}

async fn filter_value_counts_ignore_repeats_and_absent_values(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let added = store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb", "0xa"])).await;
    assert_eq!(added.unwrap(), 2);
    let added = store.add_filter_values(&p.id, "f1", &strings(&["0xb", "0xc", "0xc", "0xd"])).await;
    assert_eq!(added.unwrap(), 2, "0xb was there already, 0xc counts once");
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 4);
    assert!(store.has_filter_value(&p.id, "f1", "0xc").await.unwrap());
    assert!(!store.has_filter_value(&p.id, "f1", "0xe").await.unwrap());

    let removed = store.remove_filter_values(&p.id, "f1", &strings(&["0xa", "0xa", "0xe"])).await;
    assert_eq!(removed.unwrap(), 1, "0xe was never there, 0xa counts once");
    assert!(!store.has_filter_value(&p.id, "f1", "0xa").await.unwrap());
    assert_eq!(store.remove_filter_values(&p.id, "f1", &[]).await.unwrap(), 0);
    // Values that need escaping in the backends' bulk statements arrive intact.
    let odd = strings(&["say \"hi\"", "back\\slash", "tab\tand\nline", "ünï€ode", "", "\u{1}"]);
    assert_eq!(store.add_filter_values(&p.id, "f2", &odd).await.unwrap(), 6);
    let mut listed = list_all(store.as_ref(), &p.id, "f2", 100).await;
    listed.sort();
    let mut expected = odd.clone();
    expected.sort();
    assert_eq!(listed, expected);
    assert!(store.has_filter_value(&p.id, "f2", "say \"hi\"").await.unwrap());
    assert_eq!(store.remove_filter_values(&p.id, "f2", &odd[..3]).await.unwrap(), 3);
    assert_eq!(store.replace_filter_values(&p.id, "f2", &odd).await.unwrap(), 6);
    assert_eq!(store.filter_value_count(&p.id, "f2").await.unwrap(), 6);
    assert_eq!(store.add_filter_values(&p.id, "f1", &[]).await.unwrap(), 0);
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 3);
}

async fn replace_makes_the_set_exactly_the_values_and_empty_clears_it(
    store: Arc<dyn MetadataStore>,
) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb", "0xc"])).await.unwrap();
    let replacement = strings(&["0xc", "0xd", "0xd", "0xe"]);
    assert_eq!(store.replace_filter_values(&p.id, "f1", &replacement).await.unwrap(), 3);
    let mut listed = list_all(store.as_ref(), &p.id, "f1", 100).await;
    listed.sort();
    assert_eq!(listed, ["0xc", "0xd", "0xe"]);

    // Values in both sets keep their place; new ones list after them.
    store.replace_filter_values(&p.id, "f1", &strings(&["0xa", "0xb", "0xc"])).await.unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0x0"])).await.unwrap();
    assert_eq!(
        store.replace_filter_values(&p.id, "f1", &strings(&["0xf", "0x0", "0xb"])).await.unwrap(),
        3
    );
    assert_eq!(list_all(store.as_ref(), &p.id, "f1", 2).await, ["0xb", "0x0", "0xf"]);

    assert_eq!(store.replace_filter_values(&p.id, "f1", &[]).await.unwrap(), 0);
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 0);
    assert_eq!(
        store.list_filter_values(&p.id, "f1", None, 10).await.unwrap(),
        FilterValuePage { values: vec![], next: None }
    );
}

async fn bulk_changes_cross_statement_chunks(store: Arc<dyn MetadataStore>) {
    // More values than one bulk statement carries on either backend (10,000 on SQLite,
    // 50,000 on PostgreSQL), with repeats spread across chunks.
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let mut values: Vec<String> = (0..60_000).map(|i| format!("0x{i:040x}")).collect();
    values.extend((0..5_000).map(|i| format!("0x{:040x}", i * 7)));
    assert_eq!(store.add_filter_values(&p.id, "f1", &values).await.unwrap(), 60_000);
    assert_eq!(store.add_filter_values(&p.id, "f1", &values).await.unwrap(), 0);
    // A request much smaller than the set (PostgreSQL probes the index instead of reading
    // the set).
    let few = vec![format!("0x{:040x}", 7), "0xnew".to_owned(), "0xnew".to_owned()];
    assert_eq!(store.add_filter_values(&p.id, "f1", &few).await.unwrap(), 1);
    assert_eq!(store.remove_filter_values(&p.id, "f1", &few[1..]).await.unwrap(), 1);
    let evens: Vec<String> = (0..120_000).step_by(2).map(|i| format!("0x{i:040x}")).collect();
    assert_eq!(store.remove_filter_values(&p.id, "f1", &evens).await.unwrap(), 30_000);
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 30_000);
    assert!(store.has_filter_value(&p.id, "f1", &format!("0x{:040x}", 59_999)).await.unwrap());
    assert!(!store.has_filter_value(&p.id, "f1", &format!("0x{:040x}", 59_998)).await.unwrap());
    assert_eq!(store.replace_filter_values(&p.id, "f1", &values).await.unwrap(), 60_000);
    let listed = list_all(store.as_ref(), &p.id, "f1", 10_000).await;
    assert_eq!(listed.len(), 60_000);
}

async fn listing_pages_in_insertion_order_with_an_exact_last_page(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f1", &strings(&["0xb", "0xa"])).await.unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0x0", "0xc"])).await.unwrap();
    let first = store.list_filter_values(&p.id, "f1", None, 2).await.unwrap();
    // Within one request the order is the store's; across requests, later adds come later.
    let mut firsts = first.values.clone();
    firsts.sort();
    assert_eq!(firsts, ["0xa", "0xb"]);
    let next = first.next.expect("two more values follow");
    let second = store.list_filter_values(&p.id, "f1", Some(next), 2).await.unwrap();
    let mut seconds = second.values.clone();
    seconds.sort();
    assert_eq!(seconds, ["0x0", "0xc"]);
    assert_eq!(second.next, None, "a page that ends exactly at the last value has no next");
    let all = store.list_filter_values(&p.id, "f1", None, 4).await.unwrap();
    assert_eq!(all.next, None);
    assert_eq!(all.values.len(), 4);
    let limit_zero = store.list_filter_values(&p.id, "f1", None, 0).await.unwrap();
    assert_eq!(limit_zero.values.len(), 1, "a limit of 0 is taken as 1");
}

async fn values_added_between_pages_list_after_and_nothing_repeats(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let initial: Vec<String> = (1..=9).map(|i| format!("b{i}")).collect();
    store.add_filter_values(&p.id, "f1", &initial).await.unwrap();
    let first = store.list_filter_values(&p.id, "f1", None, 4).await.unwrap();
    assert_eq!(first.values, ["b1", "b2", "b3", "b4"]);
    // A value that sorts first, one already listed, one already present but not yet listed.
    store.add_filter_values(&p.id, "f1", &strings(&["a0", "b2", "b7", "c0"])).await.unwrap();
    store.remove_filter_values(&p.id, "f1", &strings(&["b6"])).await.unwrap();
    let mut seen = first.values;
    let mut after = first.next;
    while let Some(cursor) = after {
        let page = store.list_filter_values(&p.id, "f1", Some(cursor), 4).await.unwrap();
        seen.extend(page.values);
        after = page.next;
    }
    assert_eq!(seen, ["b1", "b2", "b3", "b4", "b5", "b7", "b8", "b9", "a0", "c0"]);
}

async fn paging_while_another_task_adds_is_a_prefix_of_the_final_listing(
    store: Arc<dyn MetadataStore>,
) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let initial: Vec<String> = (0..500).map(|i| format!("init-{i:04}")).collect();
    store.add_filter_values(&p.id, "f1", &initial).await.unwrap();
    let writer = {
        let (store, id) = (store.clone(), p.id.clone());
        tokio::spawn(async move {
            for batch in 0..50 {
                // Each batch repeats a value of the previous one and one of the initial set.
                let mut values: Vec<String> =
                    (0..20).map(|i| format!("add-{batch:02}-{i:02}")).collect();
                values.push(format!("init-{:04}", batch * 7));
                if batch > 0 {
                    values.push(format!("add-{:02}-00", batch - 1));
                }
                store.add_filter_values(&id, "f1", &values).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let paged = list_all(store.as_ref(), &p.id, "f1", 7).await;
    writer.await.unwrap();
    let all = list_all(store.as_ref(), &p.id, "f1", 10_000).await;
    assert_eq!(all.len(), 500 + 50 * 20);
    assert_eq!(paged[..], all[..paged.len()], "paging skipped, repeated or reordered a value");
    assert!(paged.len() >= 500);
}

async fn filter_values_are_isolated_per_transform_and_pipeline(store: Arc<dyn MetadataStore>) {
    let (owner, p) = stored_pipeline(store.as_ref()).await;
    let q = filter_pipeline(&owner, "q", 1);
    store.insert_pipeline(&q, &owner.team.id, &[]).await.unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb"])).await.unwrap();
    store.add_filter_values(&p.id, "f2", &strings(&["0xa"])).await.unwrap();
    store.add_filter_values(&q.id, "f1", &strings(&["0xc"])).await.unwrap();
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 2);
    assert_eq!(store.filter_value_count(&p.id, "f2").await.unwrap(), 1);
    assert_eq!(store.filter_value_count(&q.id, "f1").await.unwrap(), 1);
    assert!(!store.has_filter_value(&q.id, "f1", "0xa").await.unwrap());

    store.replace_filter_values(&p.id, "f1", &strings(&["0xz"])).await.unwrap();
    store.remove_filter_values(&q.id, "f1", &strings(&["0xa"])).await.unwrap();
    assert_eq!(list_all(store.as_ref(), &p.id, "f2", 10).await, ["0xa"]);
    assert_eq!(list_all(store.as_ref(), &q.id, "f1", 10).await, ["0xc"]);
    assert_eq!(list_all(store.as_ref(), &p.id, "f1", 10).await, ["0xz"]);
    assert_eq!(list_all(store.as_ref(), &p.id, "f3", 10).await, Vec::<String>::new());
}

async fn values_are_stored_only_for_set_filters_of_the_stored_config(
    store: Arc<dyn MetadataStore>,
) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let values = strings(&["0xa"]);
    for (id, uid) in [("missing", "f1"), (p.id.as_str(), "s1"), (p.id.as_str(), "nope")] {
        assert_eq!(store.add_filter_values(id, uid, &values).await.unwrap(), 0, "{uid}");
        assert_eq!(store.replace_filter_values(id, uid, &values).await.unwrap(), 0, "{uid}");
        assert_eq!(store.remove_filter_values(id, uid, &values).await.unwrap(), 0, "{uid}");
        assert_eq!(store.filter_value_count(id, uid).await.unwrap(), 0, "{uid}");
    }
    // Once an update removes a set filter, writes to it (say from a request that checked the
    // old config) change nothing.
    store.add_filter_values(&p.id, "f2", &values).await.unwrap();
    let mut changed = p.clone();
    changed.pipeline_config.transforms.remove(1);
    assert!(store.update_pipeline(&changed).await.unwrap());
    assert_eq!(store.filter_value_count(&p.id, "f2").await.unwrap(), 0);
    assert_eq!(store.add_filter_values(&p.id, "f2", &values).await.unwrap(), 0);
    assert_eq!(store.filter_value_count(&p.id, "f2").await.unwrap(), 0);
    assert_eq!(store.add_filter_values(&p.id, "f1", &values).await.unwrap(), 1);
}

fn deployment(p: &Pipeline, state: DeploymentState, minutes: i64) -> DeploymentRecord {
    let at = Utc.with_ymd_and_hms(2026, 2, 1, 0, 0, 0).unwrap() + Duration::minutes(minutes);
    DeploymentRecord {
        pipeline_id: p.id.clone(),
        state,
        pipeline: p.clone(),
        deployed_at: at,
        updated_at: at + Duration::microseconds(123_456),
    }
}

async fn delete_pipeline_removes_its_values_and_deployment(store: Arc<dyn MetadataStore>) {
    let (owner, p) = stored_pipeline(store.as_ref()).await;
    let q = filter_pipeline(&owner, "q", 1);
    store.insert_pipeline(&q, &owner.team.id, &[]).await.unwrap();
    for id in [&p.id, &q.id] {
        store.add_filter_values(id, "f1", &strings(&["0xa", "0xb"])).await.unwrap();
    }
    store.put_deployment(&deployment(&p, DeploymentState::Deployed, 0)).await.unwrap();
    store.put_deployment(&deployment(&q, DeploymentState::Paused, 1)).await.unwrap();

    assert!(store.delete_pipeline(&p.id).await.unwrap());
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 0);
    assert!(store.deployment(&p.id).await.unwrap().is_none());
    assert_eq!(store.filter_value_count(&q.id, "f1").await.unwrap(), 2);
    let left = store.list_deployments().await.unwrap();
    assert_eq!(left.iter().map(|d| d.pipeline_id.as_str()).collect::<Vec<_>>(), [q.id.as_str()]);
}

async fn a_set_filter_removed_and_added_again_starts_empty(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f2", &strings(&["0xa", "0xb"])).await.unwrap();
    let mut without = p.clone();
    without.pipeline_config.transforms.remove(1);
    assert!(store.update_pipeline(&without).await.unwrap());
    assert!(store.update_pipeline(&p).await.unwrap());
    assert!(!store.has_filter_value(&p.id, "f2", "0xa").await.unwrap());
    assert_eq!(store.add_filter_values(&p.id, "f2", &strings(&["0xb", "0xc"])).await.unwrap(), 2);
    assert_eq!(list_all(store.as_ref(), &p.id, "f2", 10).await, ["0xb", "0xc"]);
}

async fn the_deployments_number_moves_with_every_write_of_a_deployment(
    store: Arc<dyn MetadataStore>,
) {
    let (owner, p) = stored_pipeline(store.as_ref()).await;
    let q = filter_pipeline(&owner, "q", 1);
    store.insert_pipeline(&q, &owner.team.id, &[]).await.unwrap();
    let mut last = store.deployments_seq().await.unwrap();
    let mut moved = async |what: &str| {
        let now = store.deployments_seq().await.unwrap();
        assert!(now > last, "{what} moves the number");
        last = now;
    };
    store.put_deployment(&deployment(&p, DeploymentState::Deployed, 1)).await.unwrap();
    moved("a deploy").await;
    store.put_deployment(&deployment(&q, DeploymentState::Deployed, 2)).await.unwrap();
    store.put_deployment(&deployment(&p, DeploymentState::Paused, 3)).await.unwrap();
    moved("a pause").await;
    assert!(store.delete_deployment(&p.id).await.unwrap());
    moved("a teardown").await;
    assert!(store.delete_pipeline(&q.id).await.unwrap());
    moved("deleting a deployed pipeline").await;
    // Reads and other writes leave it.
    store.list_deployments().await.unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap();
    assert_eq!(store.deployments_seq().await.unwrap(), last);
}

async fn deployment_round_trips_and_upserts(store: Arc<dyn MetadataStore>) {
    let (owner, p) = stored_pipeline(store.as_ref()).await;
    let q = filter_pipeline(&owner, "q", 1);
    store.insert_pipeline(&q, &owner.team.id, &[]).await.unwrap();
    assert!(store.deployment(&p.id).await.unwrap().is_none());
    assert!(store.list_deployments().await.unwrap().is_empty());

    let later = deployment(&q, DeploymentState::Deployed, 10);
    store.put_deployment(&later).await.unwrap();
    let first = deployment(&p, DeploymentState::Deployed, 0);
    store.put_deployment(&first).await.unwrap();
    assert_eq!(store.deployment(&p.id).await.unwrap(), Some(first.clone()));
    assert_eq!(store.list_deployments().await.unwrap(), [first.clone(), later.clone()]);
    let versions = store.deployment_versions().await.unwrap();
    assert_eq!(
        versions,
        [
            (p.id.clone(), DeploymentState::Deployed, sluice_core::time::format(first.updated_at)),
            (q.id.clone(), DeploymentState::Deployed, sluice_core::time::format(later.updated_at)),
        ]
    );

    let mut paused = first.clone();
    paused.state = DeploymentState::Paused;
    paused.pipeline.name = "snapshot changed".into();
    paused.updated_at = first.updated_at + Duration::minutes(3);
    store.put_deployment(&paused).await.unwrap();
    assert_eq!(store.deployment(&p.id).await.unwrap(), Some(paused.clone()));
    assert_eq!(store.list_deployments().await.unwrap().len(), 2);

    assert!(store.delete_deployment(&p.id).await.unwrap());
    assert!(!store.delete_deployment(&p.id).await.unwrap());
    assert!(store.deployment(&p.id).await.unwrap().is_none());
    assert_eq!(store.list_deployments().await.unwrap(), [later]);
    assert!(
        store.put_deployment(&deployment(&p, DeploymentState::Deployed, 0)).await.is_ok(),
        "a torn-down pipeline can be deployed again"
    );
    let mut orphan = deployment(&p, DeploymentState::Deployed, 0);
    orphan.pipeline_id = "missing".into();
    assert!(store.put_deployment(&orphan).await.is_err(), "a deployment needs its pipeline");
}

/// Databases created by an older release: migrations must keep what they hold.
mod migration {
    use super::*;

    const MIGRATION_1: &str = include_str!("../../src/migrations/0001_identity_and_pipelines.sql");

    /// The statements that leave a database as release 0.1 (migration 1) left it, with one
    /// pipeline whose set filter `f1` holds three values.
    fn version_1_database(config: &str) -> String {
        let at = "2026-01-01T00:00:00.000000Z";
        let config = config.replace('\'', "''");
        format!(
            "CREATE TABLE sluice_schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL);
             INSERT INTO sluice_schema_migrations VALUES (1, 'identity_and_pipelines', '{at}');
             {MIGRATION_1}
             INSERT INTO orgs VALUES ('org', 'acme', TRUE, TRUE, '{at}');
             INSERT INTO teams VALUES ('team', 'org', 'data', '{at}');
             INSERT INTO users VALUES ('user', 'org', 'team', 'ann', FALSE, '{at}');
             INSERT INTO pipelines VALUES ('pipe', 'org', 'user', 'p', 'd', NULL, FALSE, 'S',
                 'at_least_once', '{config}', '{at}', '{at}');
             INSERT INTO filter_values VALUES ('pipe', 'f1', '0xc'), ('pipe', 'f1', '0xa'),
                 ('pipe', 'f1', '0xb'), ('pipe', 'f2', '0xa');"
        )
    }

    fn config_json() -> String {
        let owner = Identity {
            org: sluice_core::identity::Org {
                id: "org".into(),
                name: "acme".into(),
                flags: Default::default(),
            },
            team: sluice_core::identity::Team {
                id: "team".into(),
                org_id: "org".into(),
                name: "data".into(),
            },
            user: sluice_core::identity::User {
                id: "user".into(),
                org_id: "org".into(),
                team_id: "team".into(),
                name: "ann".into(),
                is_operator: false,
            },
        };
        serde_json::to_string(&pipeline(&owner, "p", 0).pipeline_config).unwrap()
    }

    async fn migrated_values_are_kept_and_new_ones_list_after(store: Arc<dyn MetadataStore>) {
        assert_eq!(store.filter_value_count("pipe", "f1").await.unwrap(), 3);
        assert!(store.has_filter_value("pipe", "f1", "0xb").await.unwrap());
        let first = store.list_filter_values("pipe", "f1", None, 2).await.unwrap();
        assert_eq!(first.values.len(), 2);
        store.add_filter_values("pipe", "f1", &strings(&["0x0", "0xa"])).await.unwrap();
        let rest = store.list_filter_values("pipe", "f1", first.next, 10).await.unwrap();
        let mut all = first.values;
        all.extend(rest.values);
        assert_eq!(all.len(), 4);
        all[..3].sort();
        assert_eq!(all, ["0xa", "0xb", "0xc", "0x0"]);
        assert_eq!(list_all(store.as_ref(), "pipe", "f2", 10).await, ["0xa"]);
        let caller = Principal {
            user_id: "user".into(),
            team_id: "team".into(),
            org_id: "org".into(),
            is_operator: false,
            is_org_admin: false,
            flags: Default::default(),
        };
        assert!(store.pipeline_with_access("pipe", &caller).await.unwrap().is_some());
        assert!(store.delete_pipeline("pipe").await.unwrap());
        assert_eq!(store.filter_value_count("pipe", "f1").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn from_version_1_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let options =
            sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap().create_if_missing(true);
        let old = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::raw_sql(&version_1_database(&config_json())).execute(&old).await.unwrap();
        old.close().await;
        let store = SqliteStore::open(&url).await.unwrap();
        migrated_values_are_kept_and_new_ones_list_after(Arc::new(store)).await;
    }

    #[tokio::test]
    async fn from_version_1_on_postgres() {
        let options = sluice_store::testing::fresh_postgres_schema().await;
        let old = sqlx::PgPool::connect_with(options.clone()).await.unwrap();
        sqlx::raw_sql(&version_1_database(&config_json())).execute(&old).await.unwrap();
        old.close().await;
        let store = PgStore::open_with(options).await.unwrap();
        migrated_values_are_kept_and_new_ones_list_after(Arc::new(store)).await;
    }
}

/// Snapshots of large sets: a restarted process reads a set from its snapshot when the
/// snapshot is of the set's current version, and from the database otherwise.
mod set_snapshots {
    use super::*;

    #[tokio::test]
    async fn a_restart_reads_a_large_set_from_its_snapshot_only_while_it_is_current() {
        let fixture = crate::sqlite(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
        let (a, b) = (fixture.store, fixture.other);
        let dir = tempfile::tempdir().unwrap();
        a.keep_set_snapshots(dir.path().join("sets"));
        b.keep_set_snapshots(dir.path().join("sets"));
        let (_, p) = stored_pipeline(a.as_ref()).await;
        let many: Vec<String> = (0..120_000).map(|i| format!("0x{i:040x}")).collect();
        a.add_filter_values(&p.id, "f1", &many).await.unwrap();
        a.add_filter_values(&p.id, "f2", &strings(&["0xsmall"])).await.unwrap();
        assert_eq!(a.save_set_snapshots().await.unwrap(), 1, "only the large set");
        assert_eq!(a.save_set_snapshots().await.unwrap(), 0, "nothing changed since");

        // The rows go behind the stores' backs (the version stays): only a snapshot can
        // still answer with the values.
        let url = format!(
            "sqlite://{}",
            fixture._dir.as_ref().unwrap().path().join("sluice.db").display()
        );
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query("DELETE FROM filter_values").execute(&pool).await.unwrap();
        let set = b.filter_value_set(&p.id, "f1").await.unwrap();
        assert_eq!(set.len(), 120_000);
        assert!(b.has_filter_value(&p.id, "f1", &many[7]).await.unwrap());

        // A write moves the version on: the snapshot is stale and the database answers.
        a.add_filter_values(&p.id, "f1", &strings(&["0xnew"])).await.unwrap();
        let set = b.filter_value_set(&p.id, "f1").await.unwrap();
        assert_eq!(set.len(), 1);
        assert!(set.contains("0xnew"));
        pool.close().await;
    }
}

async fn secrets_are_sealed_per_org_revised_on_write_and_resealed_after_rotation(
    store: Arc<dyn MetadataStore>,
) {
    use sluice_core::secret::SecretValue;
    use sluice_store::secrets::{Keyring, SecretsKey};
    use sluice_store::{Secrets, SecretsError};

    let admin = store.ensure_identity("acme", "t", "admin", false).await.unwrap();
    let other = store.ensure_identity("other", "t", "u", false).await.unwrap();
    store.set_org_admin(&admin.user.id, true).await.unwrap();
    store
        .insert_api_key(NewApiKey {
            id: "k",
            user_id: &admin.user.id,
            prefix: "slk_adm",
            hash: "h",
        })
        .await
        .unwrap();
    let found = store.api_key_candidates("slk_adm").await.unwrap();
    assert!(found[0].principal.is_org_admin);

    let old_key = SecretsKey::generate().unwrap();
    let secrets = Secrets::new(store.clone(), Keyring::new(old_key.clone(), Vec::new()));
    let value = SecretValue::new("hunter2-value".to_owned());
    secrets.put(&admin.org.id, "hook", &value).await.unwrap();
    secrets.put(&admin.org.id, "a-first", &SecretValue::new("x".to_owned())).await.unwrap();
    let listed = secrets.list(&admin.org.id).await.unwrap();
    assert_eq!(listed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["a-first", "hook"]);
    assert!(secrets.list(&other.org.id).await.unwrap().is_empty());
    // Stored sealed: the raw row does not hold the value.
    let raw = store.secret(&admin.org.id, "hook").await.unwrap().unwrap();
    assert!(!raw.sealed.bytes.windows(13).any(|w| w == b"hunter2-value"));

    let first = secrets.resolve(&admin.org.id, &["hook"]).await.unwrap();
    assert_eq!(first["hook"].value, value);
    assert!(matches!(
        secrets.resolve(&other.org.id, &["hook"]).await,
        Err(SecretsError::Missing(name)) if name == "hook"
    ));
    // A write makes a new revision, even with the same value.
    secrets.put(&admin.org.id, "hook", &value).await.unwrap();
    let revisions = secrets.revisions(&admin.org.id, &["hook", "gone"]).await.unwrap();
    assert_ne!(revisions["hook"], first["hook"].revision);
    assert!(!revisions.contains_key("gone"));

    // Rotation: the new key with the old one as previous reseals everything once.
    let new_key = SecretsKey::generate().unwrap();
    let rotated = Secrets::new(store.clone(), Keyring::new(new_key.clone(), vec![old_key]));
    assert_eq!(rotated.reseal().await.unwrap(), 2);
    assert_eq!(rotated.reseal().await.unwrap(), 0);
    let only_new = Secrets::new(store.clone(), Keyring::new(new_key, Vec::new()));
    assert_eq!(only_new.resolve(&admin.org.id, &["hook"]).await.unwrap()["hook"].value, value);
    // The revision stays: resealing is not a change of the secret.
    let after = only_new.revisions(&admin.org.id, &["hook"]).await.unwrap();
    assert_eq!(after["hook"], revisions["hook"]);

    assert!(only_new.delete(&admin.org.id, "hook").await.unwrap());
    assert!(!only_new.delete(&admin.org.id, "hook").await.unwrap());
    assert!(!only_new.exists(&admin.org.id, "hook").await.unwrap());
}

async fn backfill_jobs_list_per_org_in_creation_order_and_update_only_from_the_given_states(
    store: Arc<dyn MetadataStore>,
) {
    use sluice_core::backfill::{BackfillJob, BackfillStatus};
    let acme = store.ensure_identity("acme", "t", "u", false).await.unwrap();
    let other = store.ensure_identity("other", "t", "u", false).await.unwrap();
    let at = |s: i64| Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Duration::seconds(s);
    let job = |id: &str, org: &str, created: i64| BackfillJob {
        job_id: id.to_owned(),
        workflow_id: BackfillJob::workflow_id_of(org, id),
        organization_id: org.to_owned(),
        status: BackfillStatus::Staging,
        job_name: format!("job {id}"),
        table: "base.dex.trades".to_owned(),
        partition_key: "block_timestamp".to_owned(),
        backfill_start: at(0),
        backfill_end: at(3600),
        filter_column: None,
        filter_values: None,
        destinations: Vec::new(),
        static_egress_ip: false,
        transforms: vec![
            sluice_core::backfill::BackfillTransform::SetFilter {
                uid: "only-usdc".to_owned(),
                filter_expr: "root = this.token_address".to_owned(),
                set_values: vec!["0xa0b8".to_owned()],
            },
            sluice_core::backfill::BackfillTransform::Script {
                uid: "shape".to_owned(),
                script: "function transform(r) { return r; }".to_owned(),
            },
        ],
        rows_failed: 0,
        transform_error: None,
        num_chunks: None,
        chunks_left: 0,
        error_message: None,
        rows_staged: 0,
        rows_delivered: 0,
        created_by: "u".to_owned(),
        created_at: at(created),
        updated_at: at(created),
        time_completed: None,
    };
    store.insert_backfill(&job("b", &acme.org.id, 20)).await.unwrap();
    store.insert_backfill(&job("a", &acme.org.id, 10)).await.unwrap();
    store.insert_backfill(&job("c", &other.org.id, 5)).await.unwrap();
    let listed: Vec<String> =
        store.list_backfills(&acme.org.id).await.unwrap().into_iter().map(|j| j.job_id).collect();
    assert_eq!(listed, ["b", "a"], "in the order they were created");
    let mut a = store.backfill("a").await.unwrap().unwrap();
    assert_eq!(a, job("a", &acme.org.id, 10));
    // Staging -> transporting, then a cancel; a late "completed" from the runner loses.
    a.status = BackfillStatus::Transporting;
    a.num_chunks = Some(3);
    a.chunks_left = 3;
    assert!(store.update_backfill(&a, &[BackfillStatus::Staging]).await.unwrap());
    let mut cancelled = a.clone();
    cancelled.status = BackfillStatus::Cancelled;
    assert!(
        store
            .update_backfill(&cancelled, &[BackfillStatus::Staging, BackfillStatus::Transporting])
            .await
            .unwrap()
    );
    a.status = BackfillStatus::Completed;
    assert!(!store.update_backfill(&a, &[BackfillStatus::Transporting]).await.unwrap());
    assert_eq!(store.backfill("a").await.unwrap().unwrap().status, BackfillStatus::Cancelled);
    let active: Vec<String> =
        store.active_backfills().await.unwrap().into_iter().map(|j| j.job_id).collect();
    assert_eq!(active, ["b", "c"]);
    assert!(store.backfill("nope").await.unwrap().is_none());
}
