//! Script transforms are compiled when they are stored: a `v8` transform whose script does
//! not parse, whose top-level code fails, or that defines no `transform` function is a 422
//! naming the transform's `script` field, with the engine's message and line.

use sluice_core::pipeline::Transform;
use sluice_core::validation::{Loc, Violation};

use crate::error::ApiError;

/// Checks the script of every `v8` transform of a list whose `loc` is `transforms_loc`
/// (each script's `loc` is `transforms_loc + [index, "script"]`).
///
/// The engine runs on the blocking pool: a script's top-level code may run for up to the
/// engine's call budget.
///
/// # Errors
/// [`ApiError::Validation`] with one violation per failing script.
pub async fn check_transform_list(
    transforms: &[Transform],
    transforms_loc: &Loc,
) -> Result<(), ApiError> {
    let scripts: Vec<(Loc, String)> = transforms
        .iter()
        .enumerate()
        .filter_map(|(index, transform)| match transform {
            Transform::Script { script, .. } => {
                Some((transforms_loc.at(index).at("script"), script.clone()))
            }
            Transform::SetFilter { .. } => None,
        })
        .collect();
    check_scripts(scripts).await
}

/// Checks one transform whose own `loc` is `transform_loc` (e.g. `["body"]` for a body that
/// is one transform object).
///
/// # Errors
/// [`ApiError::Validation`] when it is a `v8` transform whose script fails to load.
pub async fn check_transform(transform: &Transform, transform_loc: &Loc) -> Result<(), ApiError> {
    match transform {
        Transform::Script { script, .. } => {
            check_scripts(vec![(transform_loc.at("script"), script.clone())]).await
        }
        Transform::SetFilter { .. } => Ok(()),
    }
}

async fn check_scripts(scripts: Vec<(Loc, String)>) -> Result<(), ApiError> {
    if scripts.is_empty() {
        return Ok(());
    }
    let violations = tokio::task::spawn_blocking(move || {
        scripts
            .iter()
            .filter_map(|(loc, script)| {
                sluice_js::compile_check(script)
                    .err()
                    .map(|error| Violation::value(loc, error.to_string()))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|error| ApiError::Internal(format!("script check task failed: {error}")))?;
    if violations.is_empty() { Ok(()) } else { Err(ApiError::Validation(violations)) }
}
