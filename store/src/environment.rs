//! Everything the store library reads from the process environment, named in one place, in
//! groups. Each is read when a store is opened or a command starts (never per request), so a
//! program that sets a variable before it opens a store gets it. Values that cannot be read
//! are errors naming the variable, not silently ignored.

use crate::{Result, StoreError};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The store a caller that names none uses (the CLI's `--store` reads it too).
pub const GSTORE_STORE: &str = "GSTORE_STORE";
/// Bytes the local range cache of a remote store may hold.
pub const GSTORE_CACHE_BYTES: &str = "GSTORE_CACHE_BYTES";
/// The bearer token sent to a `gstore serve`.
pub const GSTORE_TOKEN: &str = "GSTORE_TOKEN";
/// A PEM file of a CA certificate trusted for `https://` stores and tiers.
pub const GSTORE_CA_CERT: &str = "GSTORE_CA_CERT";
/// Caching tiers between this machine and its store, nearest first (comma-separated URLs).
pub const GSTORE_TIERS: &str = "GSTORE_TIERS";
/// How long a remote request may receive nothing before it is dropped and tried again.
pub const GSTORE_IO_TIMEOUT: &str = "GSTORE_IO_TIMEOUT";
/// How long an unreachable remote store is waited for.
pub const GSTORE_RETRY_TIMEOUT: &str = "GSTORE_RETRY_TIMEOUT";
/// The S3 config file (`AWS_NAME=value` lines).
pub const GSTORE_S3_CONFIG: &str = "GSTORE_S3_CONFIG";
/// A file holding an encrypted store's key (or a passphrase).
pub const GSTORE_KEY_FILE: &str = "GSTORE_KEY_FILE";
/// An encrypted store's passphrase.
pub const GSTORE_PASSPHRASE: &str = "GSTORE_PASSPHRASE";
/// The passphrase `gstore key add` gives a new key.
pub const GSTORE_NEW_PASSPHRASE: &str = "GSTORE_NEW_PASSPHRASE";
/// The creation time pushes record (seconds since the epoch), for reproducible images.
pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";
/// Where a container checkpoint through runc is staged while CRIU writes it.
pub const GSTORE_STAGING_DIR: &str = "GSTORE_STAGING_DIR";

/// A variable's value when it is set and not empty.
fn set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// As [`set`], for paths (any bytes).
fn set_os(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// The XDG base directories of this user (`$XDG_…_HOME`, else under `$HOME`).
pub struct Dirs;

impl Dirs {
    /// `$XDG_DATA_HOME`, else `~/.local/share` (else the current directory).
    pub fn data_home() -> PathBuf {
        Self::base("XDG_DATA_HOME", ".local/share").unwrap_or_else(|| PathBuf::from("."))
    }

    /// `$XDG_CACHE_HOME`, else `~/.cache` (else the current directory).
    pub fn cache_home() -> PathBuf {
        Self::base("XDG_CACHE_HOME", ".cache").unwrap_or_else(|| PathBuf::from("."))
    }

    /// `$XDG_CONFIG_HOME`, else `~/.config`; `None` without either.
    pub fn config_home() -> Option<PathBuf> {
        Self::base("XDG_CONFIG_HOME", ".config")
    }

    fn base(var: &str, under_home: &str) -> Option<PathBuf> {
        set_os(var).map(PathBuf::from).or_else(|| set_os("HOME").map(|h| PathBuf::from(h).join(under_home)))
    }
}

/// `$GSTORE_STORE`, when set.
pub fn store() -> Option<String> {
    set(GSTORE_STORE)
}

/// `$GSTORE_CACHE_BYTES` (a byte count), when set.
pub fn cache_bytes() -> Result<Option<u64>> {
    set(GSTORE_CACHE_BYTES)
        .map(|v| {
            v.trim().parse().map_err(|_| StoreError::Setting {
                name: format!("{GSTORE_CACHE_BYTES}={v}"),
                why: "not a byte count".into(),
            })
        })
        .transpose()
}

/// How a client reaches a `gstore serve` (or a tier).
pub struct Http {
    /// `$GSTORE_TOKEN`.
    pub token: Option<String>,
    /// `$GSTORE_CA_CERT`.
    pub ca_cert: Option<PathBuf>,
}

impl Http {
    /// Reads the group.
    pub fn read() -> Http {
        Http { token: set(GSTORE_TOKEN), ca_cert: set_os(GSTORE_CA_CERT).map(PathBuf::from) }
    }
}

/// `$GSTORE_TIERS`, when set.
pub fn tiers() -> Option<String> {
    set(GSTORE_TIERS)
}

/// A duration variable (`30s`, `2m`, `500ms`), else `default`.
pub fn duration(name: &str, default: Duration) -> Result<Duration> {
    match set(name) {
        Some(v) => humantime::parse_duration(v.trim()).map_err(|e| StoreError::Setting {
            name: format!("{name}={v}"),
            why: format!("not a duration such as 30s or 2m ({e})"),
        }),
        None => Ok(default),
    }
}

/// The S3 settings: `AWS_*` variables, and the file that supplies those not set.
pub struct S3 {
    /// `$GSTORE_S3_CONFIG`, else `$XDG_CONFIG_HOME/gstore/s3.env` (else under `~/.config`).
    pub config_file: Option<PathBuf>,
}

impl S3 {
    /// Reads the group.
    pub fn read() -> S3 {
        S3 {
            config_file: set_os(GSTORE_S3_CONFIG)
                .map(PathBuf::from)
                .or_else(|| Dirs::config_home().map(|c| c.join("gstore/s3.env"))),
        }
    }

    /// The variable `name` (an `AWS_*` setting), when set in the environment.
    pub fn var(name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// An encrypted store's secret, as the environment names it.
pub struct Keys {
    /// `$GSTORE_KEY_FILE`.
    pub key_file: Option<PathBuf>,
    /// `$GSTORE_PASSPHRASE`.
    pub passphrase: Option<String>,
    /// `$GSTORE_NEW_PASSPHRASE`.
    pub new_passphrase: Option<String>,
}

impl Keys {
    /// Reads the group.
    pub fn read() -> Keys {
        Keys {
            key_file: set_os(GSTORE_KEY_FILE).map(PathBuf::from),
            passphrase: std::env::var(GSTORE_PASSPHRASE).ok().filter(|p| !p.is_empty()),
            new_passphrase: std::env::var(GSTORE_NEW_PASSPHRASE).ok().filter(|p| !p.is_empty()),
        }
    }
}

/// `$SOURCE_DATE_EPOCH` (seconds), when set to a number.
pub fn source_date_epoch() -> Option<u64> {
    set(SOURCE_DATE_EPOCH).and_then(|v| v.trim().parse().ok())
}

/// `$GSTORE_STAGING_DIR`, when set.
pub fn staging_dir() -> Option<PathBuf> {
    set_os(GSTORE_STAGING_DIR).map(PathBuf::from)
}

/// `$USER`, for labels.
pub fn user() -> String {
    set("USER").unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_a_bad_one_names_its_variable() {
        assert_eq!(duration("GSTORE_TEST_UNSET_DURATION", Duration::from_secs(7)).unwrap(), Duration::from_secs(7));
        std::env::set_var("GSTORE_TEST_BAD_DURATION", "soon");
        let e = duration("GSTORE_TEST_BAD_DURATION", Duration::from_secs(1)).unwrap_err().to_string();
        assert!(e.contains("GSTORE_TEST_BAD_DURATION=soon"), "{e}");
        std::env::set_var("GSTORE_TEST_GOOD_DURATION", "1500ms");
        assert_eq!(duration("GSTORE_TEST_GOOD_DURATION", Duration::ZERO).unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn a_cache_size_that_is_no_number_is_refused_by_name() {
        std::env::set_var(GSTORE_CACHE_BYTES, "lots");
        let e = cache_bytes().unwrap_err().to_string();
        assert!(e.contains("GSTORE_CACHE_BYTES=lots"), "{e}");
        std::env::set_var(GSTORE_CACHE_BYTES, "1048576");
        assert_eq!(cache_bytes().unwrap(), Some(1 << 20));
        std::env::remove_var(GSTORE_CACHE_BYTES);
        assert_eq!(cache_bytes().unwrap(), None);
    }
}
