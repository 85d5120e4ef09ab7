//! Who may do what to a pipeline (docs/contract.md §Authentication and permissions).
//!
//! | permission | held by |
//! |---|---|
//! | read | owner, editors, readers, members of a `viewer_team` |
//! | edit | owner, editors |
//! | manage | owner |
//!
//! A user holds at most one user role on a pipeline; a team role stacks with it, and the
//! caller gets the union.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::validation::{Fields, Loc, Violation, Violations};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Read,
    Edit,
    Manage,
}

/// A user's role on one pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserRole {
    Owner,
    Editor,
    Reader,
}

impl UserRole {
    pub fn name(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Editor => "editor",
            Self::Reader => "reader",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "owner" => Some(Self::Owner),
            "editor" => Some(Self::Editor),
            "reader" => Some(Self::Reader),
            _ => None,
        }
    }

    fn highest(self) -> Permission {
        match self {
            Self::Owner => Permission::Manage,
            Self::Editor => Permission::Edit,
            Self::Reader => Permission::Read,
        }
    }
}

/// What one caller may do to one pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    pub role: Option<UserRole>,
    /// The caller's team is a `viewer_team` of the pipeline.
    pub viewer_team: bool,
}

impl Access {
    /// The highest permission held, if any.
    pub fn highest(self) -> Option<Permission> {
        let team = self.viewer_team.then_some(Permission::Read);
        self.role.map(UserRole::highest).max(team)
    }

    pub fn allows(self, needed: Permission) -> bool {
        self.highest().is_some_and(|held| held >= needed)
    }
}

/// Who a pipeline is shared with, besides its owner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Grants {
    /// User ids with edit (and read) permission.
    pub editors: Vec<String>,
    /// User ids with read permission.
    pub readers: Vec<String>,
    /// Team ids whose members have read permission.
    pub viewer_teams: Vec<String>,
}

/// Validates a `PUT .../permissions` body. Each list is optional and defaults to empty; ids
/// are deduplicated. The owner cannot be listed, and a user can hold only one role.
///
/// # Errors
/// Every violation found.
pub fn validate_grants_body(
    body: &Map<String, Value>,
    owner_id: &str,
) -> Result<Grants, Vec<Violation>> {
    let mut errors = Violations::default();
    let mut fields = Fields::new(body, Loc::body());
    let read = |fields: &mut Fields<'_>, field, errors: &mut Violations| {
        let values = fields.optional_str_array(field, errors).ok().flatten().unwrap_or_default();
        let mut out: Vec<String> = Vec::new();
        for value in values {
            if !out.iter().any(|seen| seen == value) {
                out.push(value.to_owned());
            }
        }
        out
    };
    let editors = read(&mut fields, "editors", &mut errors);
    let readers = read(&mut fields, "readers", &mut errors);
    let viewer_teams = read(&mut fields, "viewer_teams", &mut errors);
    for (field, ids) in [("editors", &editors), ("readers", &readers)] {
        for (index, id) in ids.iter().enumerate() {
            let loc = fields.loc(field).at(index);
            if id == owner_id {
                errors.push(Violation::value(
                    &loc,
                    "the owner already has every permission and cannot be listed",
                ));
            } else if field == "readers" && editors.contains(id) {
                errors.push(Violation::value(
                    &loc,
                    format!(
                        "user '{id}' is listed as both editor and reader; a user holds one role"
                    ),
                ));
            }
        }
    }
    fields.finish(&mut errors, |_| None);
    errors.finish(Grants { editors, readers, viewer_teams })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_map_to_spec_permissions() {
        let cases = [
            (Some(UserRole::Owner), false, [true, true, true]),
            (Some(UserRole::Editor), false, [true, true, false]),
            (Some(UserRole::Reader), false, [true, false, false]),
            (None, true, [true, false, false]),
            (Some(UserRole::Reader), true, [true, false, false]),
            (Some(UserRole::Editor), true, [true, true, false]),
            (None, false, [false, false, false]),
        ];
        for (role, viewer_team, expected) in cases {
            let access = Access { role, viewer_team };
            let got =
                [Permission::Read, Permission::Edit, Permission::Manage].map(|p| access.allows(p));
            assert_eq!(got, expected, "{access:?}");
        }
    }

    #[test]
    fn grants_body_rejects_owner_and_double_roles() {
        let body =
            json!({"editors": ["a", "owner", "a"], "readers": ["a", "b"], "viewer_teams": ["t"]});
        let errors = validate_grants_body(body.as_object().unwrap(), "owner").unwrap_err();
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].loc, vec!["body".into(), "editors".into(), 1usize.into()]);
        assert_eq!(errors[1].loc, vec!["body".into(), "readers".into(), 0usize.into()]);

        let ok =
            validate_grants_body(json!({"readers": ["b", "b"]}).as_object().unwrap(), "o").unwrap();
        assert_eq!(ok, Grants { editors: vec![], readers: vec!["b".into()], viewer_teams: vec![] });
        assert!(validate_grants_body(json!({"editor": []}).as_object().unwrap(), "o").is_err());
    }
}
