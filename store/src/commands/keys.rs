//! `gstore key`: the key records of an encrypted store listed, added and removed, by location
//! (the records themselves: [`crate::crypto::keyring`]).

use crate::backend::Backend;
use crate::crypto::keyring::{add, list, remove, unlock, Kdf};
use crate::crypto::Secret;
use crate::error::{Result, StoreError};
use crate::format::config::StoreConfig;
use crate::repo::location::StoreLocation;
use crate::repo::store::Store;
use serde::Serialize;

/// One key record as `gstore key list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// The record's id.
    pub id: String,
    /// `passphrase` (argon2id) or `key file`.
    pub kind: &'static str,
    /// When it was added.
    pub created_unix: u64,
    /// Who added it.
    pub label: String,
    /// Why the record cannot be read, if it cannot.
    pub error: Option<String>,
}

/// The raw backend and config of the encrypted store at `location`.
fn encrypted_store(location: &StoreLocation) -> Result<(Backend, StoreConfig)> {
    let backend = location.backend()?;
    let config = Store::read_config(&backend, location)?;
    if config.encryption.is_none() {
        return Err(StoreError::Refused(format!(
            "{} is not encrypted: keys belong to encrypted stores (`gstore init --encrypt`)",
            location.describe()
        )));
    }
    Ok((backend, config))
}

/// The key records of the encrypted store at `location` (no key needed).
pub fn records(location: &StoreLocation) -> Result<Vec<KeyInfo>> {
    let (backend, _) = encrypted_store(location)?;
    let mut out: Vec<KeyInfo> = list(&backend)?
        .into_iter()
        .map(|(id, rec)| match rec {
            Ok(r) => KeyInfo {
                id,
                kind: if r.kdf == Kdf::Key { "key file" } else { "passphrase" },
                created_unix: r.created_unix,
                label: r.label,
                error: None,
            },
            Err(e) => KeyInfo { id, kind: "?", created_unix: 0, label: String::new(), error: Some(e.to_string()) },
        })
        .collect();
    out.sort_by_key(|k| k.created_unix);
    Ok(out)
}

/// Adds `new` as a user key of the encrypted store at `location`, which the user's current
/// key ([`Secret::for_store`]) must open; returns the new record's id.
pub fn add_key(location: &StoreLocation, new: &Secret) -> Result<String> {
    let (backend, config) = encrypted_store(location)?;
    let store = location.describe();
    let master = unlock(&backend, &Secret::for_store(&store)?, &store, &config)?;
    add(&backend, &master, new)
}

/// Removes key record `id` from the encrypted store at `location`, which the user's current
/// key must open (it may be the key removed, while another remains).
pub fn remove_key(location: &StoreLocation, id: &str) -> Result<()> {
    let (backend, config) = encrypted_store(location)?;
    let store = location.describe();
    let master = unlock(&backend, &Secret::for_store(&store)?, &store, &config)?;
    remove(&backend, &master, id)
}
