//! The permission matrix: each role × each endpoint, plus no key, a bad key, a revoked key
//! and another organization; and sharing through `.../permissions`.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Harness, User, pipeline_body};

struct World {
    h: Harness,
    owner: User,
    editor: User,
    reader: User,
    viewer: User,
    stranger: User,
    outsider: User,
}

impl World {
    async fn new() -> Self {
        let h = Harness::new().await;
        let owner = h.user("acme", "core", "owner").await;
        let viewer = h.user("acme", "core", "teammate").await;
        let editor = h.user("acme", "edit-team", "editor").await;
        let reader = h.user("acme", "read-team", "reader").await;
        let stranger = h.user("acme", "elsewhere", "stranger").await;
        let outsider = h.user("other-org", "core", "owner").await;
        Self { h, owner, editor, reader, viewer, stranger, outsider }
    }

    /// A pipeline of `owner` shared with `editor` and `reader`; `viewer` reads through the
    /// owner's team, the default viewer team.
    async fn shared_pipeline(&self) -> String {
        let id = self.h.create(&self.owner, pipeline_body("shared")).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (status, body) =
            self.h.put(&format!("/api/v1/beam/{id}/permissions"), &self.owner, self.grants()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        id
    }

    fn grants(&self) -> Value {
        json!({
            "editors": [self.editor.id()],
            "readers": [self.reader.id()],
            "viewer_teams": [self.owner.team()],
        })
    }

    fn roles(&self) -> [(&'static str, &User); 6] {
        [
            ("owner", &self.owner),
            ("editor", &self.editor),
            ("reader", &self.reader),
            ("viewer_team member", &self.viewer),
            ("same-org stranger", &self.stranger),
            ("other org", &self.outsider),
        ]
    }
}

const OK: StatusCode = StatusCode::OK;
const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;

#[tokio::test]
async fn each_role_gets_exactly_its_permissions_on_each_endpoint() {
    let w = World::new().await;
    let id = w.shared_pipeline().await;
    let one = format!("/api/v1/beam/{id}");
    let perms = format!("/api/v1/beam/{id}/permissions");

    // (endpoint, expected status for owner, editor, reader, viewer, stranger, other org)
    let matrix: [(Method, &str, Option<Value>, [StatusCode; 6]); 4] = [
        (Method::GET, &one, None, [OK, OK, OK, OK, NOT_FOUND, NOT_FOUND]),
        (
            Method::PUT,
            &one,
            Some(pipeline_body("shared")),
            [OK, OK, FORBIDDEN, FORBIDDEN, NOT_FOUND, NOT_FOUND],
        ),
        (Method::GET, &perms, None, [OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, NOT_FOUND, NOT_FOUND]),
        (
            Method::PUT,
            &perms,
            Some(w.grants()),
            [OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, NOT_FOUND, NOT_FOUND],
        ),
    ];
    for (method, path, body, expected) in matrix {
        for ((role, user), want) in w.roles().into_iter().zip(expected) {
            let (status, answer) =
                w.h.call(method.clone(), path, Some(&user.key), body.clone()).await;
            assert_eq!(status, want, "{role}: {method} {path}: {answer}");
            if status != OK {
                assert!(answer["detail"].is_string(), "{role}: {answer}");
            }
        }
    }

    // List shows exactly what each role can read.
    for ((role, user), visible) in w.roles().into_iter().zip([true, true, true, true, false, false])
    {
        let (status, list) = w.h.get("/api/v1/beam", user).await;
        assert_eq!(status, OK);
        let ids: Vec<&str> =
            list.as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(ids.contains(&id.as_str()), visible, "{role}");
    }

    // Delete needs manage: everyone but the owner fails, and the pipeline survives that.
    for ((role, user), want) in w
        .roles()
        .into_iter()
        .zip([OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, NOT_FOUND, NOT_FOUND])
        .skip(1)
    {
        assert_eq!(w.h.delete(&one, user).await.0, want, "{role}");
    }
    assert_eq!(w.h.get(&one, &w.owner).await.0, OK);
    assert_eq!(w.h.delete(&one, &w.owner).await.0, OK);
    assert_eq!(w.h.get(&one, &w.editor).await.0, NOT_FOUND);
}

#[tokio::test]
async fn any_authenticated_user_creates_and_reads_the_catalog() {
    let w = World::new().await;
    for (role, user) in w.roles() {
        let (status, created) = w.h.post("/api/v1/beam", user, pipeline_body(role)).await;
        assert_eq!(status, OK, "{role}");
        assert_eq!(created["owner_org_team_user_id"], user.id());
        assert_eq!(w.h.get("/api/v1/beam/sources", user).await.0, OK, "{role}");
    }
}

#[tokio::test]
async fn missing_bad_and_revoked_keys_get_401_everywhere() {
    let w = World::new().await;
    let id = w.shared_pipeline().await;
    let endpoints = [
        (Method::POST, "/api/v1/beam".to_owned(), Some(pipeline_body("x"))),
        (Method::GET, "/api/v1/beam".to_owned(), None),
        (Method::GET, "/api/v1/beam/sources".to_owned(), None),
        (Method::GET, format!("/api/v1/beam/{id}"), None),
        (Method::PUT, format!("/api/v1/beam/{id}"), Some(pipeline_body("x"))),
        (Method::DELETE, format!("/api/v1/beam/{id}"), None),
        (Method::GET, format!("/api/v1/beam/{id}/permissions"), None),
        (Method::PUT, format!("/api/v1/beam/{id}/permissions"), Some(json!({}))),
        (Method::GET, "/api/v1/beam/secrets".to_owned(), None),
        (Method::PUT, "/api/v1/beam/secrets/S".to_owned(), Some(json!({"value": "v"}))),
        (Method::DELETE, "/api/v1/beam/secrets/S".to_owned(), None),
    ];
    let revoked = w.h.user("acme", "core", "leaver").await;
    assert!(w.h.store.revoke_api_key(&sluice_api::auth::hash_key(&revoked.key)).await.unwrap());
    // The owner's key with its last digit changed: right prefix, wrong secret.
    let (head, last) = w.owner.key.split_at(w.owner.key.len() - 1);
    let almost = format!("{head}{}", if last == "0" { "1" } else { "0" });
    for (method, path, body) in endpoints {
        let (status, answer) = w.h.call(method.clone(), &path, None, body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "no key: {method} {path}");
        assert_eq!(answer, json!({"detail": "Missing API key: send it in the X-API-Key header"}));
        for key in ["nonsense", almost.as_str(), revoked.key.as_str()] {
            let (status, answer) = w.h.call(method.clone(), &path, Some(key), body.clone()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "key {key}: {method} {path}");
            assert_eq!(answer, json!({"detail": "Invalid API key"}));
        }
    }
    assert_eq!(w.h.get(&format!("/api/v1/beam/{id}"), &w.owner).await.0, OK, "nothing changed");
}

#[tokio::test]
async fn me_tells_a_user_the_ids_others_share_with() {
    let w = World::new().await;
    let (status, me) = w.h.get("/api/v1/me", &w.reader).await;
    assert_eq!(status, OK);
    assert_eq!(
        me,
        json!({
            "user_id": w.reader.id(),
            "team_id": w.reader.team(),
            "organization_id": w.reader.identity.org.id,
            "is_operator": false,
            "is_org_admin": false,
            "features": {"pipelines": true, "custom_transforms": true}
        })
    );
}

#[tokio::test]
async fn sharing_changes_take_effect_at_once() {
    let w = World::new().await;
    let id = w.shared_pipeline().await;
    let one = format!("/api/v1/beam/{id}");
    let perms = format!("/api/v1/beam/{id}/permissions");
    let (status, current) = w.h.get(&perms, &w.owner).await;
    assert_eq!(status, OK);
    assert_eq!(
        current,
        json!({"owner": w.owner.id(), "editors": [w.editor.id()], "readers": [w.reader.id()], "viewer_teams": [w.owner.team()]})
    );

    // Promote the reader, drop the editor and the owner's team, add the stranger's team.
    let body = json!({"editors": [w.reader.id()], "viewer_teams": [w.stranger.team()]});
    let (status, updated) = w.h.put(&perms, &w.owner, body).await;
    assert_eq!(status, OK);
    assert_eq!(
        updated,
        json!({"owner": w.owner.id(), "editors": [w.reader.id()], "readers": [], "viewer_teams": [w.stranger.team()]})
    );
    assert_eq!(w.h.put(&one, &w.reader, pipeline_body("by reader")).await.0, OK);
    assert_eq!(w.h.get(&one, &w.editor).await.0, NOT_FOUND);
    assert_eq!(w.h.get(&one, &w.viewer).await.0, NOT_FOUND);
    assert_eq!(w.h.get(&one, &w.stranger).await.0, OK);
    assert_eq!(w.h.put(&one, &w.stranger, pipeline_body("x")).await.0, FORBIDDEN);
    assert_eq!(w.h.get(&one, &w.owner).await.0, OK, "the owner keeps every permission");
}

#[tokio::test]
async fn sharing_rejects_unknown_foreign_and_conflicting_members() {
    let w = World::new().await;
    let id = w.shared_pipeline().await;
    let perms = format!("/api/v1/beam/{id}/permissions");
    let body = json!({
        "editors": [w.editor.id(), w.outsider.id()],
        "readers": ["no-such-user", w.editor.id(), w.owner.id()],
        "viewer_teams": [w.outsider.team()],
        "admins": []
    });
    let (status, answer) = w.h.put(&perms, &w.owner, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<&Value> =
        answer["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert_eq!(
        locs,
        [
            &json!(["body", "readers", 1]),
            &json!(["body", "readers", 2]),
            &json!(["body", "admins"]),
        ],
        "{answer}"
    );

    let body = json!({"editors": [w.outsider.id()], "readers": ["no-such-user"], "viewer_teams": [w.outsider.team()]});
    let (status, answer) = w.h.put(&perms, &w.owner, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<&Value> =
        answer["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert_eq!(
        locs,
        [
            &json!(["body", "editors", 0]),
            &json!(["body", "readers", 0]),
            &json!(["body", "viewer_teams", 0])
        ]
    );
    // The stored grants are untouched by the rejected requests.
    let (_, current) = w.h.get(&perms, &w.owner).await;
    assert_eq!(current["editors"], json!([w.editor.id()]));
    assert_eq!(current["readers"], json!([w.reader.id()]));
}

#[tokio::test]
async fn org_secrets_are_listed_by_members_and_written_only_by_org_admins_and_operators() {
    let w = World::new().await;
    let admin = w.h.user("acme", "core", "admin").await;
    w.h.store.set_org_admin(admin.id(), true).await.unwrap();
    let operator = {
        let identity = w.h.store.ensure_identity("sluice", "ops", "root", true).await.unwrap();
        let key = sluice_api::auth::issue_key(w.h.store.as_ref(), &identity.user.id, None)
            .await
            .unwrap()
            .unwrap();
        User { key, identity }
    };
    let (status, body) = w.h.put("/api/v1/beam/secrets/HOOK", &admin, json!({"value": "v1"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Every pipeline role of the org: lists, never writes; pipeline roles grant nothing here.
    for (role, user) in w.roles() {
        let (status, listed) = w.h.get("/api/v1/beam/secrets", user).await;
        assert_eq!(status, StatusCode::OK, "{role}");
        let names: Vec<&str> =
            listed.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        let expected: &[&str] = if role == "other org" { &[] } else { &["HOOK"] };
        assert_eq!(names, expected, "{role}");
        let (status, _) = w.h.put("/api/v1/beam/secrets/HOOK", user, json!({"value": "x"})).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{role} writes");
        let (status, _) = w.h.delete("/api/v1/beam/secrets/HOOK", user).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{role} deletes");
    }
    // An operator manages its own organization's secrets, not others'.
    let (status, _) = w.h.put("/api/v1/beam/secrets/OPS", &operator, json!({"value": "v"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = w.h.delete("/api/v1/beam/secrets/HOOK", &operator).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "HOOK is acme's");
    let (status, _) = w.h.delete("/api/v1/beam/secrets/HOOK", &admin).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn reading_a_pipeline_tells_the_caller_what_they_may_do_to_it() {
    let w = World::new().await;
    let id = w.shared_pipeline().await;
    let path = format!("/api/v1/beam/{id}");
    for (user, held) in [
        (&w.owner, Some("manage")),
        (&w.editor, Some("edit")),
        (&w.reader, Some("read")),
        (&w.viewer, Some("read")),
        (&w.stranger, None),
    ] {
        let (status, header) = w.h.get_header(&path, user, "x-sluice-access").await;
        assert_eq!(header.as_deref(), held, "{status}");
    }
}
