//! `gstore init` and the user keys of encrypted stores (`gstore key`).

use crate::args::{InitArgs, KeyAction};
use crate::failure::Usage;
use crate::output::Output;
use anyhow::{Context, Result};
use gstore_store::commands::keys;
use gstore_store::crypto::Secret;
use gstore_store::{Store, StoreConfig, StoreLocation};
use std::io::Write;
use std::time::Duration;

pub(crate) fn init(location: &StoreLocation, a: InitArgs, out: &Output) -> Result<()> {
    let config = StoreConfig {
        chunk_min: a.chunk_min,
        chunk_avg: a.chunk_avg,
        chunk_max: a.chunk_max,
        zstd_level: a.zstd_level,
        pack_target: a.pack_size,
        float_codec: !a.no_float_codec,
        huffman_lanes: !a.zstd_lanes,
        min_saving: a.min_saving,
        ..StoreConfig::default()
    };
    let key = if a.encrypt {
        let secret = match Secret::from_env()? {
            Some(s) => s,
            None => new_passphrase("GSTORE_PASSPHRASE")?,
        };
        Some(Store::init_encrypted(location, &config, &secret)?)
    } else if Secret::in_env() {
        return Err(Usage(
            "GSTORE_KEY_FILE or GSTORE_PASSPHRASE is set, but --encrypt is not given: pass --encrypt for an encrypted store, or unset them for an unencrypted one".into(),
        )
        .into());
    } else {
        Store::init(location, &config)?;
        None
    };
    // The config as stored, with the first key's id for an encrypted store.
    let mut report = serde_json::to_value(Store::read_config(&location.backend()?, location)?)?;
    if let Some(k) = &key {
        report["key"] = serde_json::json!(k);
    }
    out.emit(&report, || {
        let what = if key.is_some() { "an empty encrypted store" } else { "an empty store" };
        let mut s = format!("initialized {what} at {}", location.describe());
        if let Some(k) = &key {
            s.push_str(&format!(
                "\nits first key is {k}: keep the key (or passphrase) safe, nothing can open the store without one"
            ));
        }
        s
    })
}

/// A new passphrase from the terminal, asked for twice (`env` names the variable that gives
/// one without asking).
fn new_passphrase(env: &str) -> Result<Secret> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return Err(Usage(format!(
            "no key given: set GSTORE_KEY_FILE or {env}, or run from a terminal to type a passphrase"
        ))
        .into());
    }
    let first = Secret::prompt("new passphrase: ")?;
    let again = Secret::prompt("the same passphrase again: ")?;
    let same = match (&first, &again) {
        (Secret::Passphrase(a), Secret::Passphrase(b)) => a == b,
        (Secret::Key(a), Secret::Key(b)) => a == b,
        _ => false,
    };
    if !same {
        return Err(Usage("the two passphrases differ".into()).into());
    }
    Ok(first)
}

/// `gstore key ...`.
pub(crate) fn key(location: &StoreLocation, action: KeyAction, out: &Output) -> Result<()> {
    match action {
        KeyAction::Generate { file } => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .with_context(|| format!("creating key file {}", file.display()))?;
            f.write_all(Secret::new_key_file_text().as_bytes()).and_then(|()| f.sync_all())?;
            out.emit(&serde_json::json!({ "key_file": file }), || {
                format!("wrote a new key to {}: give it with GSTORE_KEY_FILE", file.display())
            })
        }
        KeyAction::List => {
            let keys = keys::records(location)?;
            out.emit(&keys, || {
                let mut s = format!("{:<16}  {:<10}  {:<20}  LABEL", "ID", "KIND", "ADDED");
                for k in &keys {
                    let added =
                        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(k.created_unix));
                    let label = k.error.as_deref().unwrap_or(&k.label);
                    s.push_str(&format!("\n{:<16}  {:<10}  {:<20}  {label}", k.id, k.kind, added.to_string()));
                }
                s
            })
        }
        KeyAction::Add { new_key_file } => {
            let new = match new_key_file {
                Some(f) => Secret::from_file(&f)?,
                None => match gstore_store::environment::Keys::read().new_passphrase {
                    Some(p) => Secret::Passphrase(p.into()),
                    None => new_passphrase(gstore_store::environment::GSTORE_NEW_PASSPHRASE)?,
                },
            };
            let id = keys::add_key(location, &new)?;
            out.emit(&serde_json::json!({ "added": id }), || format!("added key {id}"))
        }
        KeyAction::Remove { id } => {
            keys::remove_key(location, &id)?;
            out.emit(&serde_json::json!({ "removed": id }), || format!("removed key {id}"))
        }
    }
}
