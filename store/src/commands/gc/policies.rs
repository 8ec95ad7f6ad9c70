//! Stored retention policies (`policies.json`, docs/GC.md): per tag name, or per name prefix
//! written `PREFIX*` (`*` alone: every name), the rules `gstore gc` applies to that name's
//! images without being told. A name takes the policy of its own name, else of the longest
//! prefix it starts with; names no policy covers go by the command line's rules. Written by
//! compare-and-swap, so two writers at once both land.

use super::retention::Policy;
use crate::error::{ObjectKind, Result, StoreError};
use crate::format::key::ObjectKey;
use crate::format::record;
use crate::format::tag::TagRef;
use crate::repo::store::Store;
use std::collections::BTreeMap;

/// Every stored policy, by pattern.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policies {
    /// The file's format: 1.
    pub format: u32,
    /// The rules, by pattern: a tag name, or a name prefix ending in `*`.
    pub policies: BTreeMap<String, Policy>,
}

impl record::Versioned for Policies {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl Policies {
    /// Parses `policies.json`, refusing other formats and unknown fields.
    pub fn from_json(bytes: &[u8]) -> Result<Policies> {
        Ok(record::decode(bytes, ObjectKind::Policies, "policies.json")?)
    }

    /// The policies `policies.json` holds (`None`: the store has none yet).
    fn from_stored(bytes: Option<&[u8]>) -> Result<Policies> {
        bytes.map_or_else(|| Ok(Policies { format: 1, policies: BTreeMap::new() }), Policies::from_json)
    }

    /// The policy for tag name `name`, with its pattern: its own name's, else the longest
    /// prefix pattern it starts with.
    pub fn for_name(&self, name: &str) -> Option<(&str, &Policy)> {
        if let Some((p, policy)) = self.policies.get_key_value(name) {
            return Some((p.as_str(), policy));
        }
        self.policies
            .iter()
            .filter_map(|(p, policy)| Some((p.as_str(), p.strip_suffix('*')?, policy)))
            .filter(|(_, prefix, _)| name.starts_with(prefix))
            .max_by_key(|(_, prefix, _)| prefix.len())
            .map(|(p, _, policy)| (p, policy))
    }
}

/// Refuses a pattern that is neither a tag name nor a name prefix followed by `*`.
fn check_pattern(pattern: &str) -> Result<()> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    if name.is_empty() && pattern == "*" {
        return Ok(());
    }
    TagRef::from_parts(name, "latest").map(|_| ()).map_err(|e| StoreError::Name {
        name: format!("{pattern:?}"),
        why: format!("not a tag name or a name prefix followed by '*': {e}"),
    })
}

/// The stored policies (none when the store has no `policies.json`).
pub fn read(store: &Store) -> Result<Policies> {
    Policies::from_stored(store.backend().get_opt(&ObjectKey::Policies)?.as_deref())
}

/// Stores `policy` for `pattern`, replacing the one it had; returns every policy as stored.
pub fn set(store: &Store, pattern: &str, policy: Policy) -> Result<Policies> {
    check_pattern(pattern)?;
    if policy.prefix.is_some() {
        return Err(StoreError::Refused("a stored policy's pattern says which names it covers: no prefix".into()));
    }
    policy.check()?;
    if policy.is_none() {
        return Err(StoreError::Refused(
            "a policy needs a rule: keep-last, keep-within, keep-daily or keep-weekly".into(),
        ));
    }
    change(store, |all| {
        all.policies.insert(pattern.to_string(), policy.clone());
        Ok(())
    })
}

/// Removes the policy of `pattern` (not found if there is none); returns what remains.
pub fn remove(store: &Store, pattern: &str) -> Result<Policies> {
    change(store, |all| match all.policies.remove(pattern) {
        Some(_) => Ok(()),
        None => Err(StoreError::NotFound { what: ObjectKind::Policies, key: pattern.to_string() }),
    })
}

/// Applies `edit` to the stored policies by compare-and-swap; returns them as written.
fn change(store: &Store, mut edit: impl FnMut(&mut Policies) -> Result<()>) -> Result<Policies> {
    let mut written = None;
    store.backend().update(&ObjectKey::Policies, |current| {
        let mut all = Policies::from_stored(current.map(|b| &b[..]))?;
        edit(&mut all)?;
        let bytes = serde_json::to_vec_pretty(&all).expect("policies serialize");
        written = Some(all);
        Ok(Some(bytes))
    })?;
    Ok(written.expect("an update that succeeded wrote the policies"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep_last(n: usize) -> Policy {
        Policy { keep_last: Some(n), ..Default::default() }
    }

    #[test]
    fn a_name_takes_its_own_policy_else_the_longest_prefix() {
        let all = Policies {
            format: 1,
            policies: [
                ("*", keep_last(9)),
                ("run-*", keep_last(3)),
                ("run-4*", keep_last(2)),
                ("run-42", keep_last(1)),
            ]
            .into_iter()
            .map(|(p, r)| (p.to_string(), r))
            .collect(),
        };
        let pattern = |name: &str| all.for_name(name).map(|(p, _)| p);
        assert_eq!(pattern("run-42"), Some("run-42"));
        assert_eq!(pattern("run-43"), Some("run-4*"));
        assert_eq!(pattern("run-5"), Some("run-*"));
        assert_eq!(pattern("model"), Some("*"));
        let none = Policies { format: 1, policies: BTreeMap::new() };
        assert_eq!(none.for_name("model"), None);
    }

    #[test]
    fn the_file_refuses_unknown_rules_and_formats() {
        let ok = br#"{"format": 1, "policies": {"run-*": {"keep_last": 3, "keep_daily": 7}}}"#;
        let p = Policies::from_json(ok).unwrap();
        assert_eq!(p.policies["run-*"], Policy { keep_last: Some(3), keep_daily: Some(7), ..Default::default() });
        let unknown = br#"{"format": 1, "policies": {"run-*": {"keep_last": 3, "keep_monthly": 2}}}"#;
        assert!(Policies::from_json(unknown).unwrap_err().to_string().contains("keep_monthly"));
        let newer = br#"{"format": 2, "policies": {}}"#;
        assert!(Policies::from_json(newer).unwrap_err().to_string().contains("format 2"));
    }

    #[test]
    fn patterns_are_names_or_prefixes() {
        for good in ["model", "run-*", "*", "team.a_x*"] {
            assert!(check_pattern(good).is_ok(), "{good}");
        }
        for bad in ["", "a*b*", "../x", "a b"] {
            assert!(check_pattern(bad).is_err(), "{bad}");
        }
    }
}
